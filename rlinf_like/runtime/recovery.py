"""Runs that survive a lost worker process: the recovery policy, in one place.

When a worker process dies (`WorkerDiedError`: killed, crashed, out of memory), the run is relaunched in the same
driver process from its last committed checkpoint, and the steps since then are replayed. A resumed run equals a
straight one bit for bit (the checkpoint holds weights, optimizer, scheduler, step, RNG and the data order), so the
replayed steps are the ones the lost attempt ran, and the final weights are a fault-free run's. Every worker kind is
recovered the same way: whatever group lost a process, all groups are relaunched on fresh processes, which costs
their start-up plus the replayed steps (at most `save_every - 1`).

`runner.max_restarts` bounds it (0: a dead worker stops the run, naming it). Each fault is one line in the log and
in `<output_dir>/faults.jsonl` (what died, in which call, at which step, the checkpoint it resumed from), which the
resumed run reads for its `faults/` metrics. Beyond the bound the run stops with an error naming every fault.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from rlinf_like.runtime.errors import WorkerDiedError

log = logging.getLogger(__name__)
T = TypeVar("T")
FAULTS = "faults.jsonl"


class RestartsExhaustedError(RuntimeError):
    """More workers died than `runner.max_restarts` allows; names every fault of the run."""

    def __init__(self, faults: list[dict], max_restarts: int):
        self.faults = faults
        lines = "\n".join(f"  {i + 1}. {describe(f)}" for i, f in enumerate(faults))
        super().__init__(f"{len(faults)} worker faults, over runner.max_restarts={max_restarts}:\n{lines}")


def describe(fault: dict) -> str:
    at = f"at step {fault['step']}" if fault.get("step") is not None else "before the first step"
    return f"{fault['group']}[rank {fault['rank']}] died during {fault['method']}() {at}: {fault['detail']}"


def read_faults(out: str | Path) -> list[dict]:
    """The faults a run in `out` recovered from so far (oldest first)."""
    path = Path(out) / FAULTS
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def fault_metrics(faults: list[dict]) -> dict[str, float]:
    """`restarts/<group>` per component, `restarts` and `replayed_steps` in all (tracked under `faults/`)."""
    out: dict[str, float] = {"restarts": float(len(faults)),
                             "replayed_steps": float(sum(f.get("replayed_steps") or 0 for f in faults))}
    for f in faults:
        out[f"restarts/{f['group']}"] = out.get(f"restarts/{f['group']}", 0.0) + 1
    return out


def run_with_restarts(attempt: Callable[[bool], T], *, max_restarts: int, resume: bool, out: str | Path,
                      committed_step: Callable[[], int | None]) -> T:
    """`attempt(resume)` until it returns; after a dead worker, again with `resume=True` (from the last committed
    checkpoint, `committed_step()`; a fresh start when there is none), at most `max_restarts` times."""
    faults: list[dict] = []
    if not resume:  # a fresh run in a used folder: an earlier run's faults are not this one's
        (Path(out) / FAULTS).unlink(missing_ok=True)
    while True:
        began = time.monotonic()
        try:
            return attempt(resume)
        except WorkerDiedError as err:
            step = getattr(err, "run_step", None)
            resumed_from = committed_step()
            fault = {"group": err.group, "rank": err.rank, "method": err.method, "detail": err.detail,
                     "memory_kill": err.memory_kill, "step": step, "resumed_from": resumed_from,
                     "replayed_steps": None if step is None else step - (resumed_from or 0),
                     "attempt_s": round(time.monotonic() - began, 3), "time": time.strftime("%Y-%m-%d %H:%M:%S")}
            faults.append(fault)
            if len(faults) > max_restarts:
                if max_restarts == 0:
                    raise
                raise RestartsExhaustedError(faults, max_restarts) from err
            Path(out).mkdir(parents=True, exist_ok=True)
            with (Path(out) / FAULTS).open("a") as f:
                f.write(json.dumps(fault) + "\n")
            where = f"checkpoint step {resumed_from}" if resumed_from is not None else "the start (no checkpoint yet)"
            log.warning(f"fault {len(faults)} of at most {max_restarts}: {describe(fault)}; relaunching every worker "
                        f"group and resuming from {where}, replaying {fault['replayed_steps'] or 0} step(s)")
            resume = True
