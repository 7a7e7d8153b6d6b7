"""Gemma 3 270M, the second real family, offline (`bash scripts/get_gemma3.sh` makes models/gemma3-270m/; the tests
marked `gemma3` skip, naming it, without the folder): the converted folder, the native engine's greedy tokens against
transformers' on the real checkpoint (past its sliding window), and a weight sync from an FSDP actor.

The tiny random Gemma 3 (tests/test_model_families.py, tests/test_paged_kv_cache.py) runs everywhere, CI included."""

import json
import os
from pathlib import Path

import pytest
import torch
from greedy_contract import assert_greedy_contract

from rlinf_like.models import load_tokenizer
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine

pytestmark = pytest.mark.gemma3

# plain-text prompts (a base model: no chat template) of 6 to ~90 tokens
TOPICS = ["The capital of France is", "def fibonacci(n):\n", "Question: What is 12 + 7?\nAnswer:",
          "Once upon a time, in a small village,", "The three primary colours are",
          "import numpy as np\n\n# a function that", "Water boils at", "My favourite book is"]


def prompts(n: int) -> list[str]:
    """n prompts, every fourth one made long by a preceding passage (past a 32-token window)."""
    passage = ("The history of mathematics spans thousands of years, from counting and measuring in ancient "
               "civilisations to the abstract theories of today. ")
    return [(passage * (1 + i % 3) if i % 4 == 3 else "") + TOPICS[i % len(TOPICS)] + " " * (i // len(TOPICS))
            for i in range(n)]


def small_window_copy(src: str, dst: Path, window: int) -> str:
    """The checkpoint with sliding_window set to `window` (weights linked, not copied), so prompts of ~100 tokens
    exercise the sliding layers' masks, which the real window of 512 would leave unused."""
    dst.mkdir()
    for f in Path(src).iterdir():
        os.symlink(f.resolve(), dst / f.name)
    (dst / "config.json").unlink()
    config = json.loads((Path(src) / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "sliding_window": window}))
    return str(dst)


def test_the_converted_folder_is_gemma3_text_without_a_chat_template(gemma3_path):
    config = json.loads((Path(gemma3_path) / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and "quantization_config" not in config
    assert (config["sliding_window"], config["layer_types"].count("full_attention"), config["vocab_size"]) == (
        512, 3, 262144)
    tok = load_tokenizer(gemma3_path)
    assert not tok.chat_template  # the base model: data.chat_template=auto falls back to the raw text
    assert tok("Hello").input_ids[0] == tok.bos_token_id == config["bos_token_id"]  # Gemma needs its <bos>


@pytest.mark.parametrize("dtype,n", [("float32", 32), ("bfloat16", 8)])
def test_native_engine_decodes_transformers_greedy_tokens_past_the_sliding_window(gemma3_path, tmp_path, dtype, n):
    from transformers import AutoModelForCausalLM

    path = small_window_copy(gemma3_path, tmp_path / "w32", 32)
    tok = load_tokenizer(path)
    params = SamplingParams(max_new_tokens=64, temperature=0.0, ignore_eos=True)
    reqs = [RolloutRequest(f"r{i}", tok(p).input_ids, params, 1) for i, p in enumerate(prompts(n))]
    assert max(len(r.prompt_ids) for r in reqs) > 32 * 1.5  # prefill past the window too, not only decode
    ours = make_engine(RolloutConfig(engine="native", model_path=path, max_batch_size=n, max_context=256,
                                     dtype=dtype)).generate(reqs)
    reference = make_engine(RolloutConfig(engine="hf", model_path=path, dtype=dtype)).generate(reqs)
    fp32_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32) if dtype != "float32" else None
    agreed = assert_greedy_contract(ours, reference, dtype, fp32_model)
    assert min(agreed) >= (64 if dtype == "float32" else 8), agreed


def test_after_a_weight_sync_from_an_fsdp_actor_the_engine_decodes_transformers_tokens(gemma3_path, tmp_path,
                                                                                     cluster):
    """The rollout starts from a perturbed copy (its tokens differ); after the FSDP actor (2 ranks, the real
    weights) syncs into it, greedy tokens equal transformers' on the real checkpoint again."""
    from safetensors.torch import load_file, save_file
    from test_rollout_worker import FSDPActor, sync_once

    from rlinf_like.workers.rollout.worker import RolloutWorker

    perturbed = tmp_path / "perturbed"
    perturbed.mkdir()
    for f in Path(gemma3_path).iterdir():
        if f.name != "model.safetensors":
            os.symlink(f.resolve(), perturbed / f.name)
    weights = load_file(Path(gemma3_path) / "model.safetensors")
    for name in [n for n in weights if ".post_feedforward_layernorm." in n]:  # a (1 + w) norm scale: w moved
        weights[name] = weights[name] + 0.5
    save_file(weights, str(perturbed / "model.safetensors"), metadata={"format": "pt"})
    del weights

    tok = load_tokenizer(gemma3_path)
    params = SamplingParams(max_new_tokens=24, temperature=0.0, ignore_eos=True)
    reqs = [RolloutRequest(f"r{i}", tok(p).input_ids, params, 1) for i, p in enumerate(prompts(4))]
    reference = make_engine(RolloutConfig(engine="hf", model_path=gemma3_path, dtype="float32")).generate(reqs)
    placement = cluster.place({"actor": "0-1", "rollout": "0"})
    rollout = RolloutWorker.create_group(RolloutConfig(dtype="float32", model_path=str(perturbed), max_batch_size=4,
                                                       max_context=128)).launch(cluster, placement, "rollout")
    actor = FSDPActor.create_group(gemma3_path).launch(cluster, placement, "actor")
    try:
        [before] = rollout.generate(reqs).wait()
        assert [r.response_ids for r in before] != [r.response_ids for r in reference]
        sync_once(actor, rollout, bucket_bytes=64 << 20, timeout=300)
        [after] = rollout.generate(reqs).wait()
        assert_greedy_contract(after, reference, "float32")
    finally:
        rollout.shutdown()
        actor.shutdown()
