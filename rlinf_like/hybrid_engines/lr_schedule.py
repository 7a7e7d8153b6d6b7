"""Learning-rate schedules as pure multipliers of the base LR: constant, linear, cosine, with warmup."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class SchedulerConfig:
    kind: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    total_steps: int = 1000  # for linear / cosine decay
    min_lr_ratio: float = 0.0  # the decayed LR floor, as a fraction of the base LR


def lr_multiplier(cfg: SchedulerConfig) -> Callable[[int], float]:
    """step -> factor: linear warmup from 0 over `warmup_steps`, then the schedule's decay to
    `min_lr_ratio` at `total_steps` (held there afterwards)."""
    if cfg.kind not in SCHEDULES:
        raise ValueError(f"scheduler kind {cfg.kind!r} is not one of {list(SCHEDULES)}")
    if cfg.warmup_steps < 0 or cfg.total_steps <= cfg.warmup_steps and cfg.kind != "constant":
        raise ValueError(f"scheduler needs 0 <= warmup_steps < total_steps, got {cfg.warmup_steps}, {cfg.total_steps}")

    def factor(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.kind == "constant":
            return 1.0
        progress = min(1.0, (step - cfg.warmup_steps) / (cfg.total_steps - cfg.warmup_steps))
        decay = 1.0 - progress if cfg.kind == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * decay

    return factor
