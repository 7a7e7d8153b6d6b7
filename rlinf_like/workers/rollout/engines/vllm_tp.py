"""What the vLLM engine declares and passes for tensor parallelism; free of vllm imports (tested without it).

`rollout.tp_size` > 1 is vLLM's own `tensor_parallel_size`, its workers started by its multiprocessing executor
(`distributed_executor_backend="mp"`, what vLLM uses on one node, said explicitly). The replica's first rank
starts the engine (leader_tp.py): on GPU with CUDA_VISIBLE_DEVICES set to the replica's GPUs; on CPU with
VLLM_CPU_OMP_THREADS_BIND giving each TP worker its own cores (vLLM's "auto" binds rank N to the N-th NUMA node,
which a one-node machine does not have for N >= 1).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager

from rlinf_like.workers.rollout.engines.leader_tp import scoped_env

# Why vLLM is the recommended CPU engine for real checkpoints: the measured native / vLLM throughput
# (bench/rollout.py --vs vllm; docs/benchmarks/rollout.md, "Native vs vLLM").
CPU_CHOICE = ("bench/rollout.py --vs vllm on SmolLM2-135M (2 CPU threads each, vLLM bound to them, 32 prompts x 4 "
              "samples x 64 tokens, AMD Zen 4): native / vLLM tokens/s = 0.57 in fp32 (0.94 with "
              "rollout.fp32_kernels=onednn), 1.05 in bf16, parity (docs/benchmarks/rollout.md, \"Native vs vLLM\")")


def tp_kwargs(tp_size: int) -> dict:
    """vllm.LLM's keyword arguments for `tp_size` devices (none for one: vLLM's defaults)."""
    if tp_size <= 1:
        return {}
    return {"tensor_parallel_size": tp_size, "distributed_executor_backend": "mp"}


def cpu_thread_binding(tp_size: int, cores: list[int] | None = None) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for `tp_size` CPU workers: this process's cores split into as many contiguous
    lists, "|"-separated (2 cores, tp 2: "0|1"); fewer cores than workers share them round robin."""
    cores = sorted(os.sched_getaffinity(0)) if cores is None else list(cores)
    if len(cores) < tp_size:
        return "|".join(str(cores[i % len(cores)]) for i in range(tp_size))
    per, extra = divmod(len(cores), tp_size)
    lists, start = [], 0
    for rank in range(tp_size):
        n = per + (rank < extra)
        lists.append(",".join(map(str, cores[start:start + n])))
        start += n
    return "|".join(lists)


def tp_env(tp_size: int, device: str, devices: str | None) -> AbstractContextManager[None]:
    """The environment vLLM's TP workers start under (nothing for one device). A binding the user set is kept."""
    if tp_size <= 1:
        return scoped_env()
    if str(device).startswith("cuda"):
        return scoped_env(CUDA_VISIBLE_DEVICES=devices)
    bind = None if "VLLM_CPU_OMP_THREADS_BIND" in os.environ else cpu_thread_binding(tp_size)
    return scoped_env(VLLM_CPU_OMP_THREADS_BIND=bind)
