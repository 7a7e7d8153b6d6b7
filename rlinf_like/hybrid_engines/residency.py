"""Offload / onload of parameters, gradients and optimizer state, in place.

Collocated actor and rollout take turns on a device, so each must be able to give its memory
back and take it again without rebuilding anything. We work on *storages*, not tensors:

* offload copies each storage's bytes into a host buffer, then `resize_(0)`s the storage, so
  the device memory is freed while every Parameter, `.grad` and optimizer-state tensor object
  (and every reference the optimizer or FSDP holds to them) stays valid;
* onload resizes the storage back and copies the bytes in, bit-exact.

Working per storage handles tied weights, views and FSDP2's DTensor shards the same way, and a
storage shared by several tensors moves once. Host buffers are allocated on first use and
reused afterwards (pinned when the device is a GPU), so offload never holds two host copies.

The freed device memory is kept for the next onload, as CUDA's caching allocator keeps a freed block
until `empty_cache()`. On CPU the default allocator hands large blocks back to the OS, and onload then
page-faults every fresh page (measured: 4-6x slower than a copy into warm memory), so for CPU storages
the manager swaps the block out into a spare storage instead of `resize_(0)` and swaps it back on onload.
`release_cache()` gives those blocks back (CUDA: `torch.cuda.empty_cache()` does the same for its cache).

Whether a worker *should* move anything when it hands its device to a collocated peer is `turn_moves`: on CPU the
device memory is the host memory an offload would copy into, so a move frees nothing. The workers' offload verbs ask
it; this manager moves whatever it is asked to (on CPU too: its tests and `force=True` rely on that).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from rlinf_like.hybrid_engines.tensors import local_tensor

log = logging.getLogger(__name__)

PARTS = ("params", "grads", "optimizer")
HISTORY = 64  # moves kept; a long run offloads every step
CPU_STAYS = ("collocated turns on CPU move nothing (the trainers, the reference and the rollout keep their memory): "
             "the device memory is the host memory an offload would copy into, so a move frees nothing and costs a "
             "copy each way (and the native rollout's KV cache a re-allocation)")
_said_why = False


def turn_moves(device: str | torch.device, force: bool = False, say: bool = False) -> bool:
    """Whether a worker on `device` moves its memory off when it gives the device to a collocated peer: not on CPU
    (`CPU_STAYS`), unless `force`. With `say` (one rank of one group: the run's log says it once) the first decision
    to stay is logged."""
    global _said_why
    if force or torch.device(device).type != "cpu":
        return True
    if say and not _said_why:
        _said_why = True
        log.info(CPU_STAYS)
    return False


@dataclass
class MoveStats:
    part: str
    direction: str  # "offload" | "onload"
    bytes: int
    seconds: float

    @property
    def gb_per_s(self) -> float:
        return self.bytes / 1e9 / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class _Slot:
    storage: torch.UntypedStorage
    nbytes: int
    host: torch.Tensor | None = None  # uint8 host copy, allocated once
    spare: torch.UntypedStorage | None = None  # the freed device block while offloaded (kept, CPU only)


@dataclass
class _Part:
    slots: dict[int, _Slot] = field(default_factory=dict)
    offloaded: bool = False


def _byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def _own_storages(model: nn.Module) -> None:
    """Give every parameter and buffer a storage of its own that `resize_` accepts. transformers'
    `from_pretrained` leaves a plain (unsharded) module's tensors on the mapped safetensors file, which
    cannot be resized: those are copied once (the Parameter objects stay; FSDP's shards are already owned)."""
    for t in (*model.parameters(), *model.buffers()):
        if not local_tensor(t.data).untyped_storage().resizable():
            t.data = t.data.clone()


class ResidencyManager:
    """Moves the parts of one model (and optionally its optimizer) between device and host."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 pin_memory: bool | None = None, keep_freed: bool = True):
        self.model, self.optimizer = model, optimizer
        self.pin_memory = pin_memory
        # keep CPU blocks freed by offload for the next onload (see module doc); only for a model that lives on the
        # CPU: a GPU model's few host storages (e.g. optimizer step counters) take the path verified on GPU
        self.keep_freed = (keep_freed and hasattr(torch.UntypedStorage, "_swap_data_ptr_")
                           and all(p.device.type == "cpu" for p in model.parameters()))
        _own_storages(model)
        self._parts = {p: _Part() for p in PARTS}
        self.history: deque[MoveStats] = deque(maxlen=HISTORY)  # recent moves, for the step log

    # --- what belongs to each part ------------------------------------------------------------------
    def _tensors(self, part: str) -> Iterator[torch.Tensor]:
        if part == "params":
            for p in self.model.parameters():
                yield local_tensor(p.data)
            for b in self.model.buffers():
                yield b
        elif part == "grads":
            for p in self.model.parameters():
                if p.grad is not None:
                    yield local_tensor(p.grad)
                if getattr(p, "main_grad", None) is not None:  # megatron's DDP accumulates here
                    yield p.main_grad
        elif part == "optimizer" and self.optimizer is not None:
            for state in self.optimizer.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        yield local_tensor(value)

    def _storages(self, part: str) -> dict[int, torch.UntypedStorage]:
        """The distinct storages behind `part`, keyed by identity (stable across resize_)."""
        storages: dict[int, torch.UntypedStorage] = {}
        for t in self._tensors(part):
            storage = t.untyped_storage()
            storages.setdefault(storage._cdata, storage)
        return storages

    def _collect(self, part: str) -> dict[int, _Slot]:
        """Non-empty storages of `part` as slots; cached slots keep their host buffers."""
        known = self._parts[part].slots
        slots: dict[int, _Slot] = {}
        for key, storage in self._storages(part).items():
            if storage.nbytes() == 0:
                continue
            slot = known.get(key)
            if slot is None or slot.nbytes != storage.nbytes():
                slot = _Slot(storage, storage.nbytes())
            slots[key] = slot
        return slots

    # --- moving ---------------------------------------------------------------------------------------
    def offload(self, parts: Iterable[str] = PARTS) -> list[MoveStats]:
        return [self._offload(p) for p in self._check(parts)]

    def onload(self, parts: Iterable[str] = PARTS) -> list[MoveStats]:
        return [self._onload(p) for p in self._check(parts)]

    def is_offloaded(self, part: str) -> bool:
        return self._parts[self._check([part])[0]].offloaded

    def _check(self, parts: Iterable[str]) -> list[str]:
        parts = [parts] if isinstance(parts, str) else list(parts)
        unknown = [p for p in parts if p not in PARTS]
        if unknown:
            raise ValueError(f"unknown residency part(s) {unknown}; allowed: {list(PARTS)}")
        return parts

    def _offload(self, part: str) -> MoveStats:
        state = self._parts[part]
        if state.offloaded:
            return self._record(part, "offload", 0, 0.0)
        start = time.perf_counter()
        state.slots = self._collect(part)
        copied = 0
        for slot in state.slots.values():
            if slot.host is None:
                pin = self.pin_memory if self.pin_memory is not None else slot.storage.device.type == "cuda"
                slot.host = torch.empty(slot.nbytes, dtype=torch.uint8, pin_memory=pin)
            slot.host.copy_(_byte_view(slot.storage), non_blocking=True)
            copied += slot.nbytes
        self._sync(state)
        for slot in state.slots.values():  # free only once every copy has landed
            if self.keep_freed and slot.storage.device.type == "cpu":
                slot.spare = slot.spare if slot.spare is not None else torch.UntypedStorage(0)
                slot.storage._swap_data_ptr_(slot.spare)  # the storage is now empty; the spare holds the block
            else:
                slot.storage.resize_(0)
        state.offloaded = True
        return self._record(part, "offload", copied, time.perf_counter() - start)

    def _onload(self, part: str) -> MoveStats:
        state = self._parts[part]
        if not state.offloaded:
            return self._record(part, "onload", 0, 0.0)
        start = time.perf_counter()
        copied = 0
        for slot in state.slots.values():
            if slot.spare is not None and slot.spare.nbytes() == slot.nbytes:
                slot.storage._swap_data_ptr_(slot.spare)  # the same, already faulted-in block comes back
            else:
                slot.storage.resize_(slot.nbytes)
            _byte_view(slot.storage).copy_(slot.host, non_blocking=True)
            copied += slot.nbytes
        self._sync(state)
        state.offloaded = False
        return self._record(part, "onload", copied, time.perf_counter() - start)

    @staticmethod
    def _sync(state: _Part) -> None:
        if any(s.storage.device.type == "cuda" for s in state.slots.values()):
            torch.cuda.current_stream().synchronize()

    def _record(self, part: str, direction: str, nbytes: int, seconds: float) -> MoveStats:
        stats = MoveStats(part, direction, nbytes, seconds)
        self.history.append(stats)
        return stats

    # --- reporting ------------------------------------------------------------------------------------
    def device_bytes(self, part: str) -> int:
        """Bytes `part` holds on its device right now (0 after offload)."""
        return sum(storage.nbytes() for storage in self._storages(part).values())

    def cached_bytes(self) -> int:
        """Freed device bytes kept for the next onload (CPU storages while offloaded)."""
        slots = [s for part in self._parts.values() for s in part.slots.values()]
        return sum(s.spare.nbytes() for s in slots if s.spare is not None)

    def release_cache(self) -> int:
        """Give the kept blocks back to the allocator (and so to the OS); onload then allocates afresh."""
        released = self.cached_bytes()
        for part in self._parts.values():
            for slot in part.slots.values():
                slot.spare = None
        return released

    def host_bytes(self) -> int:
        return sum(s.host.numel() for part in self._parts.values() for s in part.slots.values() if s.host is not None)
