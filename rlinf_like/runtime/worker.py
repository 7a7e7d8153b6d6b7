"""Worker: the base class of every role (actor, rollout, env, ...), run as a Ray actor.

A subclass is an ordinary class; `MyWorker.create_group(*args).launch(cluster, placement, name)`
starts one Ray actor per rank. Inside, `self.rank`, `self.world_size`, `self.device` and the
group's process group are available already in `__init__`.
"""

from __future__ import annotations

from typing import Any

from rlinf_like.runtime import comm
from rlinf_like.runtime.placement import Device
from rlinf_like.runtime.worker_group import WorkerGroup
from rlinf_like.runtime.worker_host import WorkerContext, control, is_control

__all__ = ["Worker", "WorkerContext", "control", "is_control"]


class Worker:
    """Subclass and add methods; call them on the group returned by `create_group(...).launch(...)`."""

    _ctx: WorkerContext

    @classmethod
    def create_group(cls, *args: Any, **kwargs: Any) -> WorkerGroup:
        return WorkerGroup(cls, args, kwargs)

    # --- identity --------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self._ctx.rank

    @property
    def world_size(self) -> int:
        return self._ctx.world_size

    @property
    def group_name(self) -> str:
        return self._ctx.group_name

    @property
    def device(self) -> Device:
        return self._ctx.device

    @property
    def torch_device(self) -> str:
        # Ray sets CUDA_VISIBLE_DEVICES to this worker's GPU, so it is cuda:0 there; in process every GPU is visible
        if self._ctx.device.kind != "gpu":
            return "cpu"
        return f"cuda:{self._ctx.device.index}" if self._ctx.in_process else "cuda:0"

    @property
    def name(self) -> str:
        return f"{self.group_name}[rank {self.rank}]"

    # --- communication ---------------------------------------------------------------------
    @property
    def process_group(self):
        """The group's own torch.distributed group (the default group of this process)."""
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError(f"{self.name}: launched with init_process_group=False, so it has no process group")
        return dist.group.WORLD

    @control
    def device_memory(self) -> tuple[int, int] | None:
        """This rank's GPU memory held by torch's allocator, now and at its peak (bytes); None on a CPU slot.
        A control method, so a rank busy in a long call (a serve loop) still answers."""
        if self.device.kind != "gpu":
            return None
        import torch

        return torch.cuda.memory_allocated(self.torch_device), torch.cuda.max_memory_allocated(self.torch_device)

    def peer_group(self, name: str) -> comm.PeerGroup:
        groups = getattr(self, "_peer_groups", {})
        if name not in groups:
            raise KeyError(f"{self.name} is in no peer group {name!r}; it is in {sorted(groups)}")
        return groups[name]
