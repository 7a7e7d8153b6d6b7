"""What the embodied loop sends between processes besides the `Trajectory`: plain dataclasses that
the env worker, the rollout worker and the runner all import (this module imports no worker).

env worker -> rollout: a `StepMessage` per stage and step (over the wire, `link.py`);
env worker / rollout -> runner: `EnvSpecs` once, then per collect `EnvStats` and `CollectResult`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlinf_like.data.trajectory import Trajectory
from rlinf_like.envs.base import ActionSpec, EpisodeStats, FieldSpec, Obs, StepResult


@dataclass(frozen=True)
class EnvSpecs:
    """What an env worker serves: the policy is built from the specs, the rollout's loop from the layout."""

    obs_spec: dict[str, FieldSpec]
    action_spec: ActionSpec
    envs_per_stage: int
    stages: int


@dataclass
class StepMessage:
    """One stage's envs after a step, as the rollout reads it: the obs to act on, and the step's outcome."""

    obs: Obs  # after auto-reset, [n, ...] per field
    final_obs: Obs  # the truncated envs' last obs (to bootstrap from); other rows repeat obs
    reward: np.ndarray  # [n] float32
    terminated: np.ndarray  # [n] bool
    truncated: np.ndarray  # [n] bool

    @classmethod
    def first(cls, obs: Obs, n: int) -> StepMessage:
        """A collect's first message: the observation alone, no step before it (zeros)."""
        return cls(obs, obs, np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool))

    @classmethod
    def after(cls, result: StepResult) -> StepMessage:
        return cls(result.obs, result.final_obs, result.rewards, result.terminated, result.truncated)


@dataclass
class EnvStats:
    """What the envs of one rank did during a collect (an env worker's, or the rollout's own envs)."""

    episodes: list[EpisodeStats] = field(default_factory=list)  # finished during the collect
    busy_s: float = 0.0  # time spent stepping the simulators
    steps: int = 0  # env steps (steps x envs)
    wall_s: float = 0.0  # the env worker's whole collect; 0 for envs in the rollout's process


@dataclass
class CollectResult:
    """A rollout rank's collect: its timings, the trajectory unless it went on a channel, and the
    stats of the envs it stepped itself (`attach_envs`), standing in for an env worker's."""

    busy_s: float  # inference (and bootstrap values)
    wall_s: float
    trajectory: Trajectory | None = None
    env: EnvStats | None = None
