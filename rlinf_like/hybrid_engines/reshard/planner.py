"""Plan which slices move from which source rank to which target rank.

For each target rank and tensor, the planner intersects the target's box with the boxes the
source ranks hold. Replicated sources (several ranks with the same box) are deduplicated:
one holder per region, the target's own rank when it holds it (collocated, no copy across
processes), else spread round-robin over the holders so no rank sends everything.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from rlinf_like.hybrid_engines.reshard.layout import Box, TensorLayout, box_slices, dtype_from_name


class ReshardError(ValueError):
    """Layouts cannot be resharded; the message names the tensor."""


@dataclass(frozen=True)
class Transfer:
    src_name: str
    dst_name: str
    src_rank: int
    dst_rank: int
    src_box: Box  # in the source rank's local coordinates
    dst_box: Box  # in the target rank's local coordinates
    numel: int
    itemsize: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class NameMap:
    """Declarative training -> inference names: ordered (regex, replacement) rules; first match wins,
    names no rule matches keep their name."""

    rules: tuple[tuple[str, str], ...] = ()

    def __call__(self, name: str) -> str:
        for pattern, replacement in self.rules:
            if re.fullmatch(pattern, name):
                return re.sub(pattern, replacement, name)
        return name


def _intersect(a: Box, b: Box) -> Box | None:
    out = tuple((max(alo, blo), min(ahi, bhi)) for (alo, ahi), (blo, bhi) in zip(a, b))
    return out if all(lo < hi for lo, hi in out) else None


def _relative(box: Box, origin: Box) -> Box:
    return tuple((lo - olo, hi - olo) for (lo, hi), (olo, _) in zip(box, origin))


def _numel(box: Box) -> int:
    n = 1
    for lo, hi in box:
        n *= hi - lo
    return n


def _unique_regions(layout: TensorLayout) -> dict[Box, list[int]]:
    """Distinct non-empty source boxes -> ranks holding each; they must tile the tensor exactly."""
    holders: dict[Box, list[int]] = defaultdict(list)
    for rank, box in enumerate(layout.boxes):
        if _numel(box) > 0:
            holders[box].append(rank)
    boxes = list(holders)
    for i, a in enumerate(boxes):
        for b in boxes[i + 1 :]:
            if _intersect(a, b) is not None:
                raise ReshardError(f"tensor {layout.name!r}: source boxes {a} and {b} partly overlap")
    total = 1
    for n in layout.shape:
        total *= n
    if sum(_numel(b) for b in boxes) != total:
        raise ReshardError(f"tensor {layout.name!r}: source ranks do not hold the whole tensor {layout.shape}")
    return holders


def plan_reshard(
    sources: Sequence[TensorLayout], targets: Sequence[TensorLayout], name_map: NameMap | None = None
) -> list[Transfer]:
    """Transfers that give every target rank exactly its box of every target tensor."""
    name_map = name_map or NameMap()
    by_target_name = {name_map(s.name): s for s in sources}
    missing = [t.name for t in targets if t.name not in by_target_name]
    if missing:
        raise ReshardError(f"target tensors {missing} have no source (after the name map)")
    transfers = []
    for target in targets:
        source = by_target_name[target.name]
        if source.shape != target.shape:
            raise ReshardError(
                f"tensor {target.name!r}: source {source.name!r} has shape {source.shape}, target {target.shape}"
            )
        src_dtype, dst_dtype = dtype_from_name(source.dtype), dtype_from_name(target.dtype)
        if src_dtype != dst_dtype and not (src_dtype.is_floating_point and dst_dtype.is_floating_point):
            raise ReshardError(
                f"tensor {target.name!r}: source {source.name!r} is {source.dtype}, target wants {target.dtype}"
                " (only floating-point dtypes convert)"
            )
        # The sender casts to the target dtype, so only target-sized bytes travel (fp32 -> bf16 halves them).
        itemsize = torch.empty(0, dtype=dst_dtype).element_size()
        regions = _unique_regions(source)
        for dst_rank, dst_box in enumerate(target.boxes):
            for src_box, holders in regions.items():
                overlap = _intersect(src_box, dst_box)
                if overlap is None:
                    continue
                src_rank = dst_rank if dst_rank in holders else holders[dst_rank % len(holders)]
                transfers.append(Transfer(
                    source.name, target.name, src_rank, dst_rank,
                    _relative(overlap, src_box), _relative(overlap, dst_box), _numel(overlap), itemsize,
                ))
    return transfers


def bucketize(transfers: Sequence[Transfer], bucket_bytes: int) -> dict[tuple[int, int], list[list[Transfer]]]:
    """Group transfers per (src_rank, dst_rank) into buckets of at most `bucket_bytes`
    (a single larger transfer gets a bucket of its own)."""
    out: dict[tuple[int, int], list[list[Transfer]]] = defaultdict(list)
    fill: dict[tuple[int, int], int] = defaultdict(int)
    for t in transfers:
        key = (t.src_rank, t.dst_rank)
        if not out[key] or fill[key] + t.nbytes > bucket_bytes:
            out[key].append([])
            fill[key] = 0
        out[key][-1].append(t)
        fill[key] += t.nbytes
    return dict(out)


def apply_in_process(
    transfers: Sequence[Transfer],
    src_shards: Mapping[int, Mapping[str, torch.Tensor]],
    dst_shards: Mapping[int, Mapping[str, torch.Tensor]],
) -> int:
    """The in-process transport: copy every planned slice. Returns the bytes copied."""
    copied = 0
    for t in transfers:
        piece = src_shards[t.src_rank][t.src_name][box_slices(t.src_box)]
        dst_shards[t.dst_rank][t.dst_name][box_slices(t.dst_box)].copy_(piece)  # casts to the target dtype
        copied += t.nbytes
    return copied
