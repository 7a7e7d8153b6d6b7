"""Tensor parallelism through an engine library's own TP (SGLang's `tp_size`, vLLM's `tensor_parallel_size`).

A replica of `rollout.tp_size` ranks is one library engine: the replica's first rank starts it over the devices
of all the replica's ranks (each Ray rank sees only its own GPU, so the first rank gathers them:
`replica_devices`, and sets them while the library spawns its TP processes: `visible_devices`). The other ranks
hold their devices for it and run a `TPFollower`: they serve nothing and receive no weights; the first rank
receives whole tensors and the library shards them itself when loading (`leader_layouts`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from rlinf_like.hybrid_engines.reshard import TensorLayout
from rlinf_like.hybrid_engines.reshard.layout import full_box
from rlinf_like.workers.rollout.base import ResultCallback, RolloutEngine
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult


def leader_layouts(shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, tp_size: int) -> list[TensorLayout]:
    """TP rank 0 (the rank driving the library) holds every tensor whole; the other TP ranks hold nothing."""
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
def scoped_env(**values: str | None) -> Iterator[None]:
    """Environment variables set (None: left as they are) for the processes a library starts inside this block."""
    before = {k: os.environ.get(k) for k, v in values.items() if v is not None}
    for k in before:
        os.environ[k] = values[k]
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def visible_devices(devices: str | None):
    """CUDA_VISIBLE_DEVICES for the processes the library starts inside this block (this process keeps its GPU)."""
    return scoped_env(CUDA_VISIBLE_DEVICES=devices)


class TPFollower(RolloutEngine):
    """A rank of a library TP replica other than its first: its device runs one of the library's TP processes."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], dtype: torch.dtype, tp_size: int, tp_rank: int):
        super().__init__()
        self._layouts = leader_layouts(shapes, dtype, tp_size)
        self._tp_rank = tp_rank
        self._empty = {l.name: torch.empty(l.local_shape(tp_rank), dtype=dtype) for l in self._layouts}

    def generate(self, requests: Sequence[RolloutRequest],
                 on_result: ResultCallback | None = None) -> list[RolloutResult]:
        return []  # the replica's first rank serves and returns its results (RolloutWorker.is_leader)

    def offload(self) -> None:  # the library's processes release their memory when the first rank offloads
        pass

    def onload(self) -> None:
        pass

    def weight_layouts(self) -> list[TensorLayout]:
        return self._layouts

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        return self._empty  # zero-sized: a sync plan sends this rank nothing

    def _layout_rank(self) -> int:
        return self._tp_rank
