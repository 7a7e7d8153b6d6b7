"""Baselines for bench/weight_sync.py, each with its buffers allocated once, outside the timed region.

- `RawBroadcast`: the naive sync, one broadcast of the whole model to every process of the group.
- `HandSync`: the best a hand-tuned per-model sync could do: point-to-point sends of exactly the slices
  the plan moves, one message per slice. A contiguous slice is sent straight from the actor's tensor
  and received straight into the rollout's tensor; only a non-contiguous slice goes through a
  preallocated staging buffer. It gives up what our sync guarantees (no version handshake, and a
  failed round leaves half-written weights), so it is a lower bound, not an alternative.
- `copy_gbps`: a plain memory copy's GB/s on this machine (torch copy_ between two preallocated buffers),
  the physical limit a sync between processes of one node can approach.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Mapping

import torch

from rlinf_like.hybrid_engines.reshard import SyncPlan
from rlinf_like.hybrid_engines.reshard.layout import box_slices, dtype_from_name
from rlinf_like.hybrid_engines.tensors import local_tensor


def machine(when: str) -> str:
    load = " / ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"machine ({when}): {platform.node()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"load average {load}")


def copy_gbps(nbytes: int, reps: int = 5) -> float:
    """Median GB/s of one copy_ of `nbytes` between two preallocated, already touched buffers (one thread)."""
    src, dst = torch.ones(nbytes, dtype=torch.uint8), torch.zeros(nbytes, dtype=torch.uint8)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return nbytes / sorted(times)[len(times) // 2] / 1e9


class RawBroadcast:
    def __init__(self, group, nbytes: int, is_source: bool):
        fill = torch.ones if is_source else torch.empty
        self.group, self.buffer = group, fill(nbytes, dtype=torch.uint8)
        self.buffer.fill_(1 if is_source else 0)  # touch every page before timing

    def run(self, src: int) -> None:
        self.group.broadcast(self.buffer, src=src)


class HandSync:
    """One side (sender or receiver) of the hand-written sync of `plan`'s transfers."""

    def __init__(self, group, plan: SyncPlan, side: str, rank: int, tensors: Mapping[str, torch.Tensor]):
        self.group, self.plan, self.side, self.rank = group, plan, side, rank
        self.tensors = tensors
        mine = []  # (transfer, tag) in plan order: both sides number the transfers alike
        tag = 0
        for bucket in plan.buckets:
            for t in bucket.transfers:
                if (t.src_rank if side == "send" else t.dst_rank) == rank:
                    mine.append((t, tag))
                tag += 1
        self.mine = mine
        self.staging = {}  # tag -> preallocated buffer, for slices that are not contiguous (or change dtype)
        for t, tag in mine:
            view, dtype = self._view(t)
            if not view.is_contiguous() or view.dtype != dtype:
                self.staging[tag] = torch.zeros(view.shape, dtype=dtype)

    def _view(self, t, tensors=None) -> tuple[torch.Tensor, torch.dtype]:
        tensors = tensors or self.tensors
        dtype = dtype_from_name(self.plan.dst_dtypes[t.dst_name])
        if self.side == "send":
            return local_tensor(tensors[t.src_name]).detach()[box_slices(t.src_box)], dtype
        return local_tensor(tensors[t.dst_name]).detach()[box_slices(t.dst_box)], dtype

    def run(self, tensors: Mapping[str, torch.Tensor] | None = None) -> None:
        """`tensors`: the sender's tensors of this round (megatron builds its HF-named shards per publish)."""
        works = []
        if self.side == "send":
            for t, tag in self.mine:
                view, _ = self._view(t, tensors)
                if tag in self.staging:
                    view = self.staging[tag].copy_(view)
                works.append(self.group.post_send(view, self.group.ranks[self.plan.dst_group][t.dst_rank], tag))
            for w in works:
                self.group.wait(w)
            return
        for t, tag in self.mine:
            view = self.staging.get(tag)
            if view is None:
                view, _ = self._view(t)
            works.append(self.group.post_recv(view, self.group.ranks[self.plan.src_group][t.src_rank], tag))
        for w in works:
            self.group.wait(w)
        for t, tag in self.mine:
            if tag in self.staging:
                self._view(t)[0].copy_(self.staging[tag])
