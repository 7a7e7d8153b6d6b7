"""Reasoning RL schedules: one file each, one loop each, built from `runners/reasoning/phases.py`.

`SCHEDULES` maps a `runner.schedule` name to its loop (by module path, imported when it runs) and
declares what the loop needs of the placement. `static` is not a loop of its own: it picks collocated
or pipelined by whether actor and rollout share devices. A new schedule is one file here plus its
registration below.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlinf_like.utils.registry import Registry, import_ref

STATIC = "static"  # collocated or pipelined, whichever the placement gives


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """A loop and what it declares; the runner's checks ask these instead of branching on schedule names."""

    loop: str  # "module:function": its train(cfg) loop
    shares_devices: bool  # True: actor and rollout take turns on the same devices; False: they run side by side
    # the rollout runs one long serve call with no step boundary (an engine that serves continuously, one rank per
    # replica); agent programs, whose endpoint serves one generate call at a time, do not run under it
    serves_continuously: bool = False
    runs_episodes: bool = True  # multi-turn rollouts (agent.env / agent.program) run under it
    check: str | None = None  # "module:function(cfg)": what it refuses before any worker starts
    check_placement: str | None = None  # "module:function(placement)": what it needs of the placed ranks
    options: tuple[str, ...] = ()  # runner.* keys only this schedule reads (refused, set, under another)

    def train(self, cfg, **options):
        return import_ref(self.loop)(cfg, **options)

    def check_config(self, cfg) -> None:
        if self.check is not None:
            import_ref(self.check)(cfg)

    def placement_check(self):
        """The function that checks a placement for this schedule, or None."""
        return None if self.check_placement is None else import_ref(self.check_placement)


SCHEDULES: Registry[Schedule] = Registry("schedule", key="runner.schedule")
_HERE = "rlinf_like.runners.reasoning.schedules"  # each loop and check by path: imported when the schedule runs
SCHEDULES.register("collocated", Schedule(loop=f"{_HERE}.collocated:train", shares_devices=True))
SCHEDULES.register("pipelined", Schedule(loop=f"{_HERE}.pipelined:train", shares_devices=False))
SCHEDULES.register("dynamic", Schedule(loop=f"{_HERE}.dynamic:train", shares_devices=True, runs_episodes=False,
                                       check=f"{_HERE}.dynamic:check", check_placement=f"{_HERE}.dynamic:rank_by_rank",
                                       options=("migrate_at",)))
SCHEDULES.register("async", Schedule(loop=f"{_HERE}.asynchronous:train", shares_devices=False, serves_continuously=True,
                                     check=f"{_HERE}.asynchronous:check"))


def schedule_choices() -> list[str]:
    return [STATIC, *SCHEDULES.names()]


def schedules_with(**declared) -> list[str]:
    """The schedule names (static included when collocated and pipelined both match) whose declarations match."""
    names = [n for n in SCHEDULES.names() if all(getattr(SCHEDULES.get(n), k) == v for k, v in declared.items())]
    return [STATIC, *names] if {"collocated", "pipelined"} <= set(names) else names
