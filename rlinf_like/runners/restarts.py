"""`train_with_restarts`: how a runner's entry point runs under the recovery policy (`runtime/recovery.py`), written
once for the reasoning and the embodied runners. Each attempt is a fresh run object on the same Ray; after the first
fault it resumes from the run folder's last committed checkpoint."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from rlinf_like.runners.common import Checkpoints
from rlinf_like.runners.run_record import CHECKPOINT
from rlinf_like.runtime import Cluster
from rlinf_like.runtime.recovery import run_with_restarts

T = TypeVar("T")


def committed_step(out: Path) -> int | None:
    """The step (reasoning) or update (embodied) of the run folder's committed checkpoint; None before the first."""
    checkpoints = Checkpoints(out / CHECKPOINT)
    if not checkpoints.exists():
        return None
    state = checkpoints.latest()[1]
    return state.get("step", state.get("iteration"))


def train_with_restarts(cfg: Any, cluster: Cluster | None, run_once: Callable[[Any, Cluster | None], T]) -> T:
    """`run_once(cfg, cluster)` under `cfg.runner.max_restarts`: every attempt after a dead worker with
    `runner.resume=true`. Without a `cluster` given, a run allowed restarts starts one Ray for all its attempts, so a
    restart relaunches the worker groups only, on the surviving ranks' processes."""
    if cluster is None and cfg.runner.max_restarts > 0 and cfg.cluster.backend != "local":
        # and the ranks' emptied processes kept (`cluster.reuse_workers`): a relaunch starts only the dead one's
        own_config = copy.copy(cfg.cluster)
        own_config.reuse_workers = True
        with Cluster(own_config) as own:
            return train_with_restarts(cfg, own, run_once)
    out = Path(cfg.runner.output_dir)

    def attempt(resume: bool) -> T:
        run_cfg = copy.copy(cfg)  # the caller's config stays as given; only this attempt's resume flag differs
        run_cfg.runner = copy.copy(cfg.runner)
        run_cfg.runner.resume = resume
        return run_once(run_cfg, cluster)

    return run_with_restarts(attempt, max_restarts=cfg.runner.max_restarts, resume=cfg.runner.resume, out=out,
                             committed_step=lambda: committed_step(out))
