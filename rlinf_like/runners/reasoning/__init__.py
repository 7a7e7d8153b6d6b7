"""Reasoning RL: data -> rollout -> reward -> (reference, critic) -> actor -> weight sync, step after step.

`train(cfg)` runs the schedule the config asks for. The placement decides between the two static ones:
actor and rollout on the same devices is collocated (they take turns, every step on-policy,
`schedules/collocated.py`); on different devices it is pipelined (the rollout runs up to
`runner.max_staleness` steps ahead, `schedules/pipelined.py`). `runner.schedule=dynamic` hands rollout
devices to the actor mid-step (`schedules/dynamic.py`).

A run warm-starts the actor with SFT (so RL starts from non-zero reward), then trains with the configured
advantage estimator and loss. Checkpoints every `save_every` steps; `runner.resume=true` continues from
the last one with the same data order.
"""

from __future__ import annotations

from rlinf_like.runners.restarts import train_with_restarts
from rlinf_like.runners.reasoning.checks import check_batch_split, check_config, check_finite
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.data.sources import load_tasks
from rlinf_like.runners.reasoning.run import RunResult
from rlinf_like.runners.reasoning.schedules import SCHEDULES, STATIC
from rlinf_like.runtime import Cluster
from rlinf_like.runtime.placement import share_devices

__all__ = ["check_batch_split", "check_config", "check_finite", "load_tasks", "schedule_of", "train"]


def schedule_of(cfg: ReasoningConfig) -> str:
    """The schedule loop `cfg` runs: `runner.schedule` when it names one, else collocated or pipelined by
    whether the placement puts actor and rollout on shared devices."""
    if cfg.runner.schedule != STATIC:
        return cfg.runner.schedule
    return "collocated" if share_devices(cfg.cluster.component_placement, "actor", "rollout") else "pipelined"


def train(cfg: ReasoningConfig, cluster: Cluster | None = None) -> RunResult:
    """Run `cfg` to its end. `cluster`: a running one to launch on (e.g. one cluster for a sweep's runs, one after
    another); its Ray stays up, and each run ends its own workers and channels. None: the run starts its own.
    A worker process that dies is recovered from the last checkpoint up to `runner.max_restarts` times
    (`runtime/recovery.py`)."""
    check_config(cfg)
    schedule = SCHEDULES.get(schedule_of(cfg))
    return train_with_restarts(
        cfg, cluster, lambda run_cfg, on: schedule.train(run_cfg, **({"cluster": on} if on is not None else {})))
