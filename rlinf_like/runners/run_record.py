"""What every runner keeps across its steps and its resumes, written once for the reasoning and the embodied
runners: the history of per-step metrics, the RL clock, the trackers, the checkpoints (the runner state they
commit holds the history and the clock) and the closing summary.json.

A checkpoint is the workers' state under `checkpoint/step_<n>/` first, then the runner state, committed
atomically (`common.Checkpoints`); a crash in between leaves the previous checkpoint whole."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rlinf_like.runners.common import Checkpoints, crash_point
from rlinf_like.runtime import WorkerGroup, wait_all
from rlinf_like.runtime.recovery import describe, fault_metrics, read_faults
from rlinf_like.utils.tracking import Trackers, make_trackers

CHECKPOINT = "checkpoint"
log = logging.getLogger(__name__)


class RunRecord:
    def __init__(self, cfg: Any, out: Path):
        """`cfg`: the run's config dataclass (its `logger` section picks the trackers; all of it goes into the
        trackers' run config and summary.json)."""
        self.cfg, self.out = cfg, out
        out.mkdir(parents=True, exist_ok=True)
        self.checkpoints = Checkpoints(out / CHECKPOINT)
        self.history: list[dict] = []
        self.clock = 0.0  # RL seconds so far: steps only, without start-up, evaluations and checkpoints
        self.trackers: Trackers | None = None
        # metrics that are their own tracker group (`ifeval/prompt_loose`): logged under their name, not `prefix/`
        self.own_tags: set[str] = set()

    def open_trackers(self) -> Trackers:
        self.trackers = make_trackers(self.cfg.logger, self.out, run_config=asdict(self.cfg))
        return self.trackers

    def close_trackers(self) -> None:
        if self.trackers is not None:
            self.trackers.close()

    def record(self, key: str, step: int, metrics: dict, prefix: str, x: int, tracked_only: dict | None = None) -> None:
        """`{key: step, **metrics}` into the history; `metrics` (plus `tracked_only`: what differs between otherwise
        identical runs, such as memory, kept out of the history that tests compare across runs) to the trackers as
        `prefix/<name>` at x-axis `x`, or under their own name where they are a group of their own (`own_tags`)."""
        self.track(prefix, {**metrics, **(tracked_only or {})}, x)
        self.history.append({key: step, **metrics})

    def track(self, prefix: str, metrics: dict, x: int) -> None:
        """`metrics` to the trackers at x-axis `x`, as `record` names them."""
        self.trackers.log({k if k in self.own_tags else f"{prefix}/{k}": v for k, v in metrics.items()}, x)

    def track_faults(self, x: int) -> None:
        """After a resume: the dead workers this run recovered from so far (`runtime/recovery.py`), the latest in
        the log and all as `faults/` metrics at x-axis `x`, so the curves show where."""
        faults = read_faults(self.out)
        if faults:
            log.info(f"fault {len(faults)} recovered (runner.max_restarts={self.cfg.runner.max_restarts}): "
                     f"{describe(faults[-1])}")
            self.track("faults", fault_metrics(faults), x)

    def save(self, step: int, groups: dict[str, WorkerGroup | None], state: dict,
             files: dict[str, bytes] | None = None) -> None:
        """Checkpoint after `step`: each group saves under its name, then `files` are written, then the runner
        state (`state` plus the history and the clock) is committed."""
        path = self.checkpoints.step_dir(step)
        path.mkdir(parents=True, exist_ok=True)
        wait_all([g.save(str(path / name)) for name, g in groups.items() if g is not None])
        for name, data in (files or {}).items():
            (path / name).write_bytes(data)
        crash_point("checkpoint", step)  # fault tests: the workers' state written, not yet committed
        self.checkpoints.commit(step, {**state, "history": self.history, "clock": self.clock})

    def can_resume(self, asked: bool) -> bool:
        return asked and self.checkpoints.exists()

    def latest(self) -> tuple[Path, dict]:
        """The committed checkpoint's directory and runner state; the history and the clock are restored."""
        path, state = self.checkpoints.latest()
        self.history, self.clock = state["history"], state["clock"]
        return path, state

    @staticmethod
    def load(path: Path, groups: dict[str, WorkerGroup | None]) -> None:
        """Each group loads what it saved under its name in `path`."""
        wait_all([g.load(str(path / name)) for name, g in groups.items() if g is not None])

    def write_summary(self, summary: dict) -> None:
        (self.out / "summary.json").write_text(json.dumps({"summary": summary, "config": asdict(self.cfg)},
                                                          indent=1, default=str))
