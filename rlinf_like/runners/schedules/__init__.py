"""Reasoning RL schedules: one file each, one loop each, built from `runners/phases.py`.

`SCHEDULES` maps a name to its `train(cfg) -> RunResult`. `runner.schedule=static` picks collocated or
pipelined from the placement (actor and rollout sharing devices or not); `dynamic` is named. A new
schedule is one file here plus its registration below.
"""

from __future__ import annotations

from rlinf_like.utils.registry import Registry
from rlinf_like.runners.schedules import collocated, dynamic, pipelined

SCHEDULE_LOOPS: Registry = Registry("schedule loop", key="runner.schedule")
SCHEDULE_LOOPS.register("collocated")(collocated.train)
SCHEDULE_LOOPS.register("pipelined")(pipelined.train)
SCHEDULE_LOOPS.register("dynamic")(dynamic.train)
