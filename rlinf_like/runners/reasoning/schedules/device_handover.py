"""Who owns which device during a collocated step: the dynamic scheduler's decisions and its log.

Collocated, the trainer and the rollout share devices and take turns. The static schedule hands
every device to the trainer once the whole rollout is done. The dynamic one (after RLinf's
pre-process / offload-sync / scale-sync protocol) hands a rollout unit's devices over as soon as that
unit has finished and offloaded, so the trainer starts on fewer ranks while the tail is generated,
and grows at optimizer-step boundaries:

- `pre_process(step)`: a step starts; every device belongs to the rollout.
- `migrate(drained, kept, requests)`: most requests are done; the unfinished ones move from the
  `drained` units onto the `kept` ones, and the drained units offload (then `offload_sync`).
- `offload_sync(unit)`: rollout unit `unit` reports it has offloaded; its devices are free.
- `scale_sync()`: the trainer, at an optimizer-step boundary, asks which of its ranks train the
  next step (`active`) and which of them join now (`joining`, they must take the current state first).

Pure bookkeeping (no Ray, no RL): the runner calls it and acts on the answers. Every decision is
recorded as an `Event`, so a test can check that a hand-over happened and when.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

HANDOVERS = ("static", "dynamic")  # devices to the trainer once the rollout is done, or unit by unit


def check_handover(value: str, key: str = "handover") -> str:
    if value not in HANDOVERS:
        raise ValueError(f"{key}={value!r} is not one of {list(HANDOVERS)}")
    return value


@dataclass
class Event:
    kind: str  # "pre_process" | "migrate" | "offload_sync" | "scale_sync"
    step: int
    detail: dict
    time_s: float = field(default_factory=time.perf_counter)


class DeviceScheduler:
    """`units[j]`: the trainer ranks that share devices with rollout unit j (a replica). Trainer
    rank i and rollout rank i sit on the same device."""

    def __init__(self, units: list[list[int]], handover: str):
        self.handover = check_handover(handover)
        ranks = sorted(r for unit in units for r in unit)
        if ranks != list(range(len(ranks))):
            raise ValueError(f"rollout units {units} must cover trainer ranks 0..n-1 exactly once")
        self.units = [sorted(u) for u in units]
        self.world = len(ranks)
        self.events: list[Event] = []
        self.step = -1
        self._offloaded: set[int] = set()
        self._active: list[int] = []

    def pre_process(self, step: int) -> None:
        self.step, self._offloaded, self._active = step, set(), []
        self.events.append(Event("pre_process", step, {"rollout_units": len(self.units)}))

    def plan_migration(self, share_done: float, serving: list[int], migrate_at: float) -> tuple[list[int], list[int]] | None:
        """(kept, drained) when the unfinished requests should move now: `migrate_at` > 0 and that share of
        the step's groups is done, and ceil(units x share left) replicas (at least one) are fewer than the
        `serving` ones. The lowest-numbered serving units are kept."""
        keep = max(1, math.ceil(len(self.units) * (1 - share_done)))
        if not migrate_at or share_done < migrate_at or keep >= len(serving):
            return None
        units = sorted(serving)
        return units[:keep], units[keep:]

    def migrate(self, drained: list[int], kept: list[int], requests: int) -> None:
        if not kept or set(drained) & set(kept) or set(drained + kept) & self._offloaded:
            raise RuntimeError(f"step {self.step}: cannot migrate from units {drained} to {kept} "
                               f"(offloaded already: {sorted(self._offloaded)})")
        self.events.append(Event("migrate", self.step, {"drained": list(drained), "kept": list(kept),
                                                        "requests": requests}))

    def offload_sync(self, unit: int) -> None:
        if unit in self._offloaded:
            raise RuntimeError(f"rollout unit {unit} reported offloaded twice in step {self.step}")
        self._offloaded.add(unit)
        self.events.append(Event("offload_sync", self.step, {"unit": unit, "ranks": self.units[unit]}))

    @property
    def rollout_done(self) -> bool:
        return len(self._offloaded) == len(self.units)

    def free_ranks(self) -> list[int]:
        """Trainer ranks whose devices the rollout has given back (dynamic), or all of them once the
        whole rollout has offloaded (static)."""
        if self.handover == "static" and not self.rollout_done:
            return []
        return sorted(r for u in self._offloaded for r in self.units[u])

    def scale_sync(self) -> tuple[list[int], list[int]]:
        """(active, joining) for the next optimizer step; `active` is empty when no device is free yet."""
        free = self.free_ranks()
        joining = [r for r in free if r not in self._active]
        if joining:
            self._active = free
            self.events.append(Event("scale_sync", self.step, {"active": list(free), "joining": joining}))
        return list(self._active), joining

    def dp_sizes(self, step: int | None = None) -> list[int]:
        """The trainer's data-parallel sizes, in the order they were granted (for a step or all)."""
        return [len(e.detail["active"]) for e in self.events
                if e.kind == "scale_sync" and (step is None or e.step == step)]
