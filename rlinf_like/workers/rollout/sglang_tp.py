"""Tensor parallelism for the SGLang engine, through SGLang's own `tp_size`.

A replica of `rollout.tp_size` ranks is one `sglang.Engine(tp_size=tp)`: the replica's first rank starts it,
with CUDA_VISIBLE_DEVICES set to the GPUs of all the replica's ranks (each Ray rank sees only its own), so
SGLang's tp scheduler processes land on those GPUs (`base_gpu_id` 0, one GPU per TP rank). The other ranks
hold their GPUs for it and run an `SGLangFollower`: they serve nothing and receive no weights; the first rank
receives whole tensors and SGLang shards them itself when loading (`update_weights_from_tensor`).

Kept free of sglang imports: `engine_kwargs` and `sglang_layouts` are plain functions (tested on CPU).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from rlinf_like.hybrid_engines.reshard import TensorLayout
from rlinf_like.hybrid_engines.reshard.layout import full_box
from rlinf_like.workers.rollout.base import ResultCallback, RolloutConfig, RolloutEngine
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult


def engine_kwargs(config: RolloutConfig, tp_size: int | None = None, **extra) -> dict:
    """`sglang.Engine`'s keyword arguments. `tp_size`: GPUs the engine spans (the replica's ranks); None: the
    config's `rollout.tp_size` (0 counts as 1 here: a standalone engine). `extra` (e.g. attention_backend,
    enable_deterministic_inference) overrides."""
    kwargs = dict(model_path=config.model_path, tp_size=tp_size or config.tp_size or 1, dtype=config.dtype,
                  random_seed=config.seed, mem_fraction_static=config.sglang_mem_fraction,
                  base_gpu_id=0,  # of the GPUs this engine was given (`visible_devices`)
                  enable_memory_saver=True, enable_weights_cpu_backup=True)  # offload keeps weights on host
    if config.max_context:
        kwargs["context_length"] = config.max_context
    kwargs.update(extra)
    return kwargs


def sglang_layouts(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, tp_size: int) -> list[TensorLayout]:
    """TP rank 0 (the rank driving SGLang) holds every tensor whole; the other TP ranks hold nothing."""
    empty = {name: tuple((0, 0) for _ in shape) for name, shape in shapes.items()}
    return [TensorLayout(name, tuple(shape), (full_box(shape),) + (empty[name],) * (tp_size - 1), str(dtype))
            for name, shape in shapes.items()]


def replica_devices(process_group) -> str:
    """The CUDA_VISIBLE_DEVICES of every rank of the replica's group, in rank order (a collective)."""
    import torch.distributed as dist

    mine = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    every: list[str | None] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(every, mine, group=process_group)
    return ",".join(str(d) for d in every)


@contextmanager
def visible_devices(devices: str | None) -> Iterator[None]:
    """CUDA_VISIBLE_DEVICES for the processes SGLang starts inside this block (this process keeps its GPU)."""
    if devices is None:
        yield
        return
    before = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = devices
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = before


class SGLangFollower(RolloutEngine):
    """A rank of an SGLang TP replica other than its first: its GPU runs one of SGLang's TP processes."""

    needs_gpu = True

    def __init__(self, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, tp_size: int, tp_rank: int):
        super().__init__()
        self._layouts = sglang_layouts(shapes, dtype, tp_size)
        self._tp_rank = tp_rank
        self._empty = {l.name: torch.empty(l.local_shape(tp_rank), dtype=dtype) for l in self._layouts}

    def generate(self, requests: Sequence[RolloutRequest],
                 on_result: ResultCallback | None = None) -> list[RolloutResult]:
        return []  # the replica's first rank serves and returns its results (RolloutWorker.is_leader)

    def offload(self) -> None:  # SGLang's processes release their memory when the first rank offloads
        pass

    def onload(self) -> None:
        pass

    def weight_layouts(self) -> list[TensorLayout]:
        return self._layouts

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        return self._empty  # zero-sized: a sync plan sends this rank nothing

    def _layout_rank(self) -> int:
        return self._tp_rank
