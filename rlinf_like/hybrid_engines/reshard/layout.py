"""Shard metadata: which part of each global tensor every rank holds.

A `Box` is one (start, stop) per dimension of the global tensor. A `TensorLayout` maps every
rank of a group to the box it holds (an empty box for a rank holding nothing, as FSDP's last
ranks can). Layouts of common schemes are built by `sharded` and `replicated`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Box = tuple[tuple[int, int], ...]


def box_slices(box: Box) -> tuple[slice, ...]:
    """Index a tensor by a box: `t[box_slices(box)]`."""
    return tuple(slice(lo, hi) for lo, hi in box)


def dtype_from_name(name: str) -> torch.dtype:
    """"torch.bfloat16" (as `str(dtype)` writes it) -> torch.bfloat16."""
    return getattr(torch, name.removeprefix("torch."))


def split_bounds(size: int, parts: int, mode: Literal["chunk", "balanced"] = "balanced") -> list[tuple[int, int]]:
    """Split [0, size) into `parts` ranges.

    "chunk": torch.chunk / FSDP2 style, ceil(size/parts) each, the last ranks short or empty;
    "balanced": torch.tensor_split style, sizes differ by at most one (TP=3 over 64 -> 22, 21, 21).
    """
    if parts <= 0:
        raise ValueError(f"cannot split into {parts} parts")
    if mode == "chunk":
        step = -(-size // parts)
        return [(min(i * step, size), min((i + 1) * step, size)) for i in range(parts)]
    if mode == "balanced":
        base, extra = divmod(size, parts)
        bounds, start = [], 0
        for i in range(parts):
            stop = start + base + (1 if i < extra else 0)
            bounds.append((start, stop))
            start = stop
        return bounds
    raise ValueError(f"split mode {mode!r} is not one of ['chunk', 'balanced']")


@dataclass(frozen=True)
class TensorLayout:
    name: str
    shape: tuple[int, ...]
    boxes: tuple[Box, ...]  # boxes[rank]
    dtype: str = "torch.float32"

    def __post_init__(self):
        for rank, box in enumerate(self.boxes):
            if len(box) != len(self.shape) or any(
                not 0 <= lo <= hi <= n for (lo, hi), n in zip(box, self.shape)
            ):
                raise ValueError(f"tensor {self.name!r}: rank {rank} box {box} does not fit shape {self.shape}")

    @property
    def world_size(self) -> int:
        return len(self.boxes)

    def local_shape(self, rank: int) -> tuple[int, ...]:
        return tuple(hi - lo for lo, hi in self.boxes[rank])


def full_box(shape: tuple[int, ...]) -> Box:
    return tuple((0, n) for n in shape)


def replicated(name: str, shape: tuple[int, ...], world_size: int, dtype: str = "torch.float32") -> TensorLayout:
    return TensorLayout(name, tuple(shape), tuple(full_box(shape) for _ in range(world_size)), dtype)


def sharded(
    name: str,
    shape: tuple[int, ...],
    world_size: int,
    dim: int,
    mode: Literal["chunk", "balanced"] = "balanced",
    dtype: str = "torch.float32",
) -> TensorLayout:
    """Split along `dim` (FSDP: dim 0, "chunk"; TP column-parallel: dim 0; row-parallel: dim 1)."""
    shape = tuple(shape)
    boxes = []
    for lo, hi in split_bounds(shape[dim], world_size, mode):
        box = list(full_box(shape))
        box[dim] = (lo, hi)
        boxes.append(tuple(box))
    return TensorLayout(name, shape, tuple(boxes), dtype)
