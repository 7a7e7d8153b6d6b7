"""A run's `final_model/` is a folder transformers loads as it is: AutoTokenizer gives the run's token ids and
carries the chat template the prompts were rendered with, the generation config has the tokenizer's ids,
AutoModelForCausalLM's greedy `generate` gives the tokens the native rollout engine gives on the same weights,
and a LoRA run's `adapter/` names its base model by absolute path (`rlinf_like/models/export.py`)."""

import json
from pathlib import Path

import pytest
import torch
from small_runs import in_process, small_reasoning_config

from rlinf_like.data.prompts import PromptFormat
from rlinf_like.models import load_tokenizer
from rlinf_like.models.export import base_model_id, complete_export
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine

TEXTS = ["What is 12 + 34?", "  two spaces,\ta tab\nand a newline", "x"]
# a template file (data.chat_template) in the tiny character vocabulary
TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}[assistant] {% endif %}")


def assert_same_tokenizer(folder: Path, run_tokenizer) -> None:
    """AutoTokenizer on the export encodes and decodes as the run's tokenizer."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(folder)
    for text in TEXTS:
        ids = run_tokenizer(text).input_ids
        assert loaded(text).input_ids == ids, (type(loaded).__name__, text)
        assert loaded.decode(ids) == run_tokenizer.decode(ids)
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (
        run_tokenizer.bos_token_id, run_tokenizer.eos_token_id, run_tokenizer.pad_token_id)


def assert_generation_config(folder: Path, run_tokenizer) -> None:
    from transformers import GenerationConfig

    generation = GenerationConfig.from_pretrained(folder)
    eos = generation.eos_token_id if isinstance(generation.eos_token_id, list) else [generation.eos_token_id]
    assert eos[0] == run_tokenizer.eos_token_id
    assert generation.bos_token_id == run_tokenizer.bos_token_id
    assert generation.pad_token_id == (run_tokenizer.pad_token_id if run_tokenizer.pad_token_id is not None else eos[0])


def assert_generate_equals_native(folder: Path, prompts: list[list[int]], new_tokens: int = 12):
    """transformers' greedy `generate` (the exported generation config: its EOS stops) on the exported folder gives
    the native engine's tokens serving the same folder in float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)
    requests = [RolloutRequest(f"r{i}", ids, params, 1) for i, ids in enumerate(prompts)]
    ours = make_engine(RolloutConfig(engine="native", model_path=str(folder), max_batch_size=4, dtype="float32",
                                     max_context=256)).generate(requests)
    for ids, result in zip(prompts, ours):
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=new_tokens)
        assert len(result.response_ids[0]) > 0 and out[0, len(ids):].tolist() == list(result.response_ids[0]), ids
    return model


def run(cfg):
    from rlinf_like.runners.reasoning import train

    # set: sized from the run's samples (rollout.kv_cache_memory_gb=0), the tiny qwen3 model's budget held less than
    # one max_context sequence and the native engine refused to start
    cfg.rollout.kv_cache_memory_gb = 0.01
    return train(in_process(cfg))


@pytest.mark.timeout(300)
def test_full_run_final_model_loads_with_its_tokenizer_template_and_generation_config(tmp_path):
    """One GRPO step on the tiny (llama) model, prompts rendered with a template file."""
    (tmp_path / "template.jinja").write_text(TEMPLATE)
    cfg = small_reasoning_config(tmp_path / "run", max_steps=1)
    cfg.model.arch = "llama"
    cfg.data.chat_template = str(tmp_path / "template.jinja")
    run(cfg)
    final = tmp_path / "run" / "final_model"
    run_tokenizer = load_tokenizer(tmp_path / "run" / "init_model")
    assert_same_tokenizer(final, run_tokenizer)
    assert_generation_config(final, run_tokenizer)

    from transformers import AutoTokenizer

    from rlinf_like.data.sources import load_tasks

    loaded = AutoTokenizer.from_pretrained(final)
    assert loaded.chat_template == TEMPLATE == (final / "chat_template.jinja").read_text()
    formatted = PromptFormat(run_tokenizer, cfg.data)
    problems = load_tasks(cfg.data).test[:2]
    prompts = [formatted.prompt_ids(p) for p in problems]
    assert [loaded.apply_chat_template(formatted.messages(p), add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for p in problems] == prompts  # what the run's prompts were
    assert_generate_equals_native(final, prompts)


@pytest.mark.timeout(300)
def test_lora_run_final_model_loads_and_its_adapter_names_the_base_by_absolute_path(tmp_path, monkeypatch):
    """One GRPO step with LoRA on the tiny (qwen3) model, started from a relative output directory: the adapter
    config's base path is absolute, and peft loads base + adapter from it alone; data.chat_template=auto on a
    tokenizer without one: the export carries no template."""
    from peft import AutoPeftModelForCausalLM

    from rlinf_like.hybrid_engines.fsdp.lora import LoraConfig

    monkeypatch.chdir(tmp_path)
    cfg = small_reasoning_config(Path("run"), max_steps=1)
    cfg.model.arch = "qwen3"
    cfg.actor.lora = LoraConfig(rank=8)
    cfg.actor.loss.entropy_coef = 0.01  # the untrained tiny model scores 0: the entropy term moves the adapters
    run(cfg)
    final = tmp_path / "run" / "final_model"
    adapter = json.loads((final / "adapter" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == str(tmp_path / "run" / "init_model")
    run_tokenizer = load_tokenizer(tmp_path / "run" / "init_model")
    assert_same_tokenizer(final, run_tokenizer)
    assert_generation_config(final, run_tokenizer)
    assert not (final / "chat_template.jinja").exists()
    prompts = [run_tokenizer(t).input_ids for t in TEXTS]
    merged = assert_generate_equals_native(final, prompts)

    monkeypatch.chdir("/")  # the adapter's base path works from anywhere
    peft_model = AutoPeftModelForCausalLM.from_pretrained(final / "adapter", dtype=torch.float32).eval()
    ids = torch.tensor([prompts[0]])
    with torch.no_grad():
        torch.testing.assert_close(peft_model(ids).logits, merged(ids).logits, rtol=1e-5, atol=1e-5)


def test_a_hub_base_is_named_by_its_id_and_a_folder_by_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "base").mkdir()
    assert base_model_id("base") == str(tmp_path / "base")
    assert base_model_id("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def _word_level_characters():
    """A character vocabulary as a WordLevel tokenizer: what transformers' Qwen2Tokenizer rebuilds as byte-level
    BPE, dropping the spaces."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from rlinf_like.models.tiny import CHARACTERS, SPECIAL_TOKENS

    core = Tokenizer(models.WordLevel({t: i for i, t in enumerate((*SPECIAL_TOKENS, *CHARACTERS))}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>")


def test_autotokenizer_on_a_qwen2_export_is_faithful_or_the_export_says_it_is_not(tmp_path, caplog):
    """transformers 5 builds its own Qwen2Tokenizer for model_type qwen2 whatever tokenizer_config.json names. The
    tiny character tokenizer is byte-level, so that gives its ids; a tokenizer it would mangle is named in a
    warning with the loader that reads tokenizer.json as it is."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    base = write_tiny_model(tmp_path / "base", TinyModelSpec(arch="qwen2"))
    for name, run_tokenizer, faithful in (("tiny", load_tokenizer(base), True),
                                          ("word-level", _word_level_characters(), False)):
        final = tmp_path / name
        final.mkdir()
        for file in ("config.json", "model.safetensors"):
            (final / file).write_bytes((base / file).read_bytes())
        warnings = complete_export(final, run_tokenizer, None)
        assert_generation_config(final, run_tokenizer)
        known = [t for t in TEXTS if run_tokenizer.unk_token_id not in run_tokenizer(t).input_ids]  # not the tab
        same = all(AutoTokenizer.from_pretrained(final)(t).input_ids == run_tokenizer(t).input_ids for t in known)
        assert same == faithful == (not warnings), (name, warnings)
        if warnings:
            assert len(warnings) == 1 and "Qwen2Tokenizer" in warnings[0] and "PreTrainedTokenizerFast" in warnings[0]
            assert warnings[0] in caplog.text
            loaded = PreTrainedTokenizerFast.from_pretrained(final)
            assert all(loaded(t).input_ids == run_tokenizer(t).input_ids for t in TEXTS)


@pytest.mark.real_model
@pytest.mark.timeout(120)
def test_smollm2_export_loads_with_its_chat_template_and_generates_as_the_native_engine(real_model_path, tmp_path):
    """SmolLM2-135M-Instruct's weights as `export_hf` writes them (config.json, generation_config.json, weights),
    completed as a run with data.chat_template=auto completes its final_model."""
    from transformers import AutoTokenizer

    from rlinf_like.data.config import DataConfig
    from rlinf_like.data.tasks import Problem

    final = tmp_path / "final_model"
    final.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        (final / name).symlink_to(Path(real_model_path) / name)
    run_tokenizer = load_tokenizer(real_model_path)
    formatted = PromptFormat(run_tokenizer, DataConfig())
    assert complete_export(final, run_tokenizer, formatted.template) == []
    assert_same_tokenizer(final, run_tokenizer)
    assert_generation_config(final, run_tokenizer)
    loaded = AutoTokenizer.from_pretrained(final)
    assert loaded.chat_template == run_tokenizer.get_chat_template()
    problems = [Problem(prompt=q, answer="") for q in ("What is 12 + 34?", "Name a colour.")]
    prompts = [formatted.prompt_ids(p) for p in problems]
    assert [loaded.apply_chat_template(formatted.messages(p), add_generation_prompt=True, tokenize=True,
                                       return_dict=False) for p in problems] == prompts
    assert_generate_equals_native(final, prompts, new_tokens=16)
