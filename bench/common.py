"""What every benchmark prints the same way: the machine it ran on, its load average, and the last JSON line.

    from bench.common import Machine, result_line
    machine = Machine.start()          # prints cores, CPU, torch, load average at start
    ...                                # each repetition printed by the bench
    machine.end()                      # prints the load average at the end
    print(result_line("name", ratio=ours / theirs, ...))   # ratios from medians, rounded

Kept free of torch at import time (run_all.py describes the machine without loading it).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
from dataclasses import dataclass, field
from importlib import metadata

from rlinf_like.utils.hardware import cpu_model, isa_flags  # noqa: F401  (benches print them)


def usable_cores() -> int:
    """Cores this process may run on (affinity), which is what a bench gets; os.cpu_count() counts the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def load_average() -> tuple[float, float, float]:
    return tuple(round(x, 2) for x in os.getloadavg())  # type: ignore[return-value]


def version_of(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def describe_machine() -> dict:
    return {"cores": usable_cores(), "cpu": cpu_model(), "isa": isa_flags(), "torch": version_of("torch"),
            "python": platform.python_version(), "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M")}


@dataclass(kw_only=True)
class Machine:
    """The machine and its load average at the start and end of a run (other jobs inflate absolute times)."""

    info: dict = field(default_factory=describe_machine)
    load_start: tuple[float, float, float] = field(default_factory=load_average)
    load_end: tuple[float, float, float] | None = None

    @classmethod
    def start(cls, settings: dict | None = None) -> Machine:
        machine = cls()
        if settings is not None:
            print("settings:", json.dumps(settings, default=str), flush=True)
        info = machine.info
        print(f"machine: {info['cores']} cores ({info['cpu']}; {info['isa']}), torch {info['torch']}, "
              f"python {info['python']}, "
              f"{info['date']}; load average at start {format_load(machine.load_start)}", flush=True)
        return machine

    def end(self) -> tuple[float, float, float]:
        self.load_end = load_average()
        print(f"load average at end {format_load(self.load_end)}", flush=True)
        return self.load_end


def format_load(load: tuple[float, ...] | list[float] | None) -> str:
    return "n/a" if not load else " / ".join(f"{x:.2f}" for x in load)


def median_ratio(numerators: list[float], denominators: list[float]) -> float:
    """median(numerators) / median(denominators): a ratio of medians, not a median of per-rep ratios."""
    return statistics.median(numerators) / statistics.median(denominators)


def result_line(bench: str, digits: int = 3, **fields) -> str:
    """The bench's last line: one JSON object; floats rounded to `digits`."""
    def rounded(v):
        if isinstance(v, float):
            return round(v, digits)
        if isinstance(v, dict):
            return {k: rounded(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [rounded(x) for x in v]
        return v
    return json.dumps({"bench": bench, **{k: rounded(v) for k, v in fields.items()}})
