"""A worker process's memory as the driver reads it (/proc, this node), and whether a dead worker's error reads as
a kill for memory (Ray's memory monitor, or a SIGKILL with no Python error: most often the kernel's OOM killer)."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import ray

GIB = 1 << 30
# Ray's words for a worker its memory monitor killed (an actor's death, or a task's OutOfMemoryError) ...
_MONITOR_KILL = ("NODE_OUT_OF_MEMORY", "running low on memory", "memory pressure")
# ... and for a process that vanished with no Python error: a SIGKILL (most often the kernel's OOM killer) or a crash
_VANISHED = ("unexpectedly exits", "SIGKILL")
_NODE_USAGE = re.compile(r"was ([\d.]+) ?GB used / ([\d.]+) ?GB limit")


@dataclass(frozen=True)
class MemorySample:
    """A rank's process memory as the driver last read it."""

    rss: int  # bytes resident
    peak: int  # the most it has had resident (VmHWM)
    at: float  # time.monotonic() of the reading

    def describe(self) -> str:
        return (f"{self.rss / GIB:.2f} GiB resident (peak {self.peak / GIB:.2f} GiB), "
                f"{time.monotonic() - self.at:.0f} s before it died")


def read_memory(pid: int) -> MemorySample | None:
    """`pid`'s resident and peak memory from /proc (Linux, this node); None when it cannot be read."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    fields = {key: value.split() for key, _, value in (line.partition(":") for line in status.splitlines())}
    try:
        return MemorySample(int(fields["VmRSS"][0]) * 1024, int(fields["VmHWM"][0]) * 1024, time.monotonic())
    except (KeyError, IndexError, ValueError):
        return None


def memory_kill_cause(err: BaseException) -> str | None:
    """One line on how `err`'s worker was killed for memory, or None when `err` does not read as a memory kill."""
    text = str(err)
    if isinstance(err, ray.exceptions.OutOfMemoryError) or (
            isinstance(err, ray.exceptions.RayActorError) and any(m in text for m in _MONITOR_KILL)):
        usage = _NODE_USAGE.search(text)
        node = f" (the node had {usage[1]} GB used of a {usage[2]} GB limit)" if usage else ""
        return f"killed for memory by Ray's memory monitor{node}"
    if isinstance(err, ray.exceptions.RayActorError) and any(m in text for m in _VANISHED):
        return "killed with no Python error: a SIGKILL, most often the kernel's OOM killer (or a crash: see its log)"
    return None
