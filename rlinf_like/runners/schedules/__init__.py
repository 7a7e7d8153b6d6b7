"""Reasoning RL schedules: one file each, one loop each, built from `runners/phases.py`.

`SCHEDULES` maps a `runner.schedule` name to its loop (by module path, imported when it runs) and
declares what the loop needs of the placement. `static` is not a loop of its own: it picks collocated
or pipelined by whether actor and rollout share devices. A new schedule is one file here plus its
registration below.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from rlinf_like.utils.registry import Registry

STATIC = "static"  # collocated or pipelined, whichever the placement gives


@dataclass(frozen=True, kw_only=True)
class Schedule:
    loop: str  # "module:function": its train(cfg) loop
    shares_devices: bool  # True: actor and rollout take turns on the same devices; False: they run side by side

    def train(self, cfg, **options):
        module, name = self.loop.split(":")
        return getattr(importlib.import_module(module), name)(cfg, **options)


SCHEDULES: Registry[Schedule] = Registry("schedule", key="runner.schedule")
SCHEDULES.register("collocated", Schedule(loop="rlinf_like.runners.schedules.collocated:train", shares_devices=True))
SCHEDULES.register("pipelined", Schedule(loop="rlinf_like.runners.schedules.pipelined:train", shares_devices=False))
SCHEDULES.register("dynamic", Schedule(loop="rlinf_like.runners.schedules.dynamic:train", shares_devices=True))
SCHEDULES.register("async", Schedule(loop="rlinf_like.runners.schedules.asynchronous:train", shares_devices=False))


def schedule_choices() -> list[str]:
    return [STATIC, *SCHEDULES.names()]
