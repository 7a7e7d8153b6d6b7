"""vLLM tensor parallelism through vLLM's own `tensor_parallel_size` (issue 22): rollout.tp_size accepted for
rollout.engine=vllm by what the class declares, the keyword arguments and CPU thread binding a TP engine starts
with, a replica's weights going whole to its first rank; where vLLM is installed, TP=2 greedy tokens equal TP=1's
and transformers', before and after new weights arrive through the sync's receiving side."""

import importlib.util

import pytest
import torch

from rlinf_like.hybrid_engines.reshard import apply_in_process, plan_reshard, sharded
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams
from rlinf_like.workers.rollout.engine import check_rollout_config
from rlinf_like.workers.rollout.engines.leader_tp import TPFollower, leader_layouts
from rlinf_like.workers.rollout.engines.vllm_tp import cpu_thread_binding, tp_kwargs

GREEDY = SamplingParams(max_new_tokens=24, temperature=0.0)
PROMPTS = [[5, 9, 14, 3, 22], [7, 7, 7], [30, 2, 41, 8, 19, 11, 4, 6], [12]]
SHAPE = dict(hidden_size=128, intermediate_size=352, num_heads=2, num_kv_heads=2)  # head_dim 64; 2 KV heads for TP=2


def test_vllm_accepts_rollout_tp_size_and_passes_it_as_its_own_tensor_parallel_size():
    assert check_rollout_config(RolloutConfig(engine="vllm", model_path="m", tp_size=2), 2).supports_tp
    assert tp_kwargs(1) == {}  # one device: vLLM's defaults, as before
    assert tp_kwargs(2) == {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}


def test_cpu_tp_workers_get_cores_of_their_own():
    assert cpu_thread_binding(2, [0, 1]) == "0|1"
    assert cpu_thread_binding(2, [0, 1, 2, 3, 4]) == "0,1,2|3,4"
    assert cpu_thread_binding(3, [4, 5]) == "4|5|4"  # fewer cores than workers: shared round robin


def test_a_vllm_tp_replica_receives_whole_tensors_on_its_first_rank_only():
    shapes = {"w": (6, 4), "b": (6,)}
    transfers = plan_reshard([sharded(n, s, 2, 0) for n, s in shapes.items()], leader_layouts(shapes, torch.float32, 2))
    assert {t.dst_rank for t in transfers} == {0}
    full = {n: torch.arange(torch.Size(s).numel(), dtype=torch.float32).reshape(s) for n, s in shapes.items()}
    src = {r: {n: full[n][3 * r:3 * r + 3] for n in shapes} for r in (0, 1)}
    leader, follower = {n: torch.zeros(s) for n, s in shapes.items()}, TPFollower(shapes, torch.float32, 2, 1)
    apply_in_process(transfers, src, {0: leader, 1: follower.weight_tensors()})
    assert all(torch.equal(leader[n], full[n]) for n in shapes)
    assert follower.generate([RolloutRequest("r", [1, 2], GREEDY)]) == []


def requests() -> list[RolloutRequest]:
    return [RolloutRequest(f"r{i}", p, GREEDY) for i, p in enumerate(PROMPTS)]


def tokens(engine) -> list[list[list[int]]]:
    results = engine.generate(requests())
    assert all(r.ok for r in results)
    return [r.response_ids for r in results]


def sync_from(vllm, hf) -> None:
    """What a weight sync's receiver does on the replica's first rank: whole tensors, then _weights_changed()."""
    source = hf.weight_tensors()
    for name, tensor in vllm.weight_tensors().items():
        tensor.copy_(source[name])
    vllm._weights_changed()


def tp2_equals_tp1_and_transformers(tmp_path, device: str = "cpu", **llm_kwargs) -> None:
    from rlinf_like.workers.rollout.engines.hf_engine import HFEngine
    from rlinf_like.workers.rollout.engines.vllm_engine import VLLMEngine

    first = str(write_tiny_model(tmp_path / "a", TinyModelSpec(arch="llama", seed=0, **SHAPE)))
    second = str(write_tiny_model(tmp_path / "b", TinyModelSpec(arch="llama", seed=1, **SHAPE)))
    config = RolloutConfig(engine="vllm", model_path=first, dtype="float32", max_context=128, max_batch_size=16)
    hf_first, hf_second = (HFEngine(RolloutConfig(engine="hf", model_path=p)) for p in (first, second))
    want = {"first": tokens(hf_first), "second": tokens(hf_second)}
    assert want["first"] != want["second"]
    got = {}
    for tp in (1, 2):
        engine = VLLMEngine(config, device=device, tp_size=tp, enforce_eager=True, **llm_kwargs)
        try:
            assert engine.tp_size == tp and len(engine.weight_layouts()[0].boxes) == tp
            got[tp, "first"] = tokens(engine)
            sync_from(engine, hf_second)
            got[tp, "second"] = tokens(engine)
        finally:
            engine.shutdown()
    for tp in (1, 2):
        assert got[tp, "first"] == want["first"] and got[tp, "second"] == want["second"], tp


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed: bash scripts/install_vllm_cpu.sh")
def test_cpu_tp2_greedy_equals_tp1_and_transformers_after_a_weight_sync(tmp_path):
    tp2_equals_tp1_and_transformers(tmp_path)


@pytest.mark.gpu
def test_gpu_tp2_greedy_equals_tp1_and_transformers_after_a_weight_sync(tmp_path):
    pytest.importorskip("vllm")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    tp2_equals_tp1_and_transformers(tmp_path, device="cuda", gpu_memory_utilization=0.3)
