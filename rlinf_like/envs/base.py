"""One vectorized env interface for every simulator adapter.

A `VectorEnv` holds `num_envs` environments and steps them together: `reset(seed)` seeds env i
with `seed + i`; `step(actions)` takes one action per env ([n, *action_shape]) or an action chunk
([n, chunk, *action_shape], executed in order until the episode ends, rewards summed), resets
finished envs at once (auto-reset: the returned obs is the new episode's first, the last obs of a
truncated episode comes back in `final_obs` for bootstrapping), and reports every finished
episode's return, length and success. Adapters implement three per-env hooks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from rlinf_like.envs.config import EnvConfig

Obs = dict[str, np.ndarray]


@dataclass(frozen=True)
class FieldSpec:
    """One observation field of one env: shape and numpy dtype name."""

    shape: tuple[int, ...]
    dtype: str
    vocab: int = 0  # a field of token ids: every id is below this (0: not token ids)


@dataclass(frozen=True)
class ActionSpec:
    kind: Literal["continuous", "discrete"]
    shape: tuple[int, ...]  # (dim,) for continuous, () for discrete
    low: tuple[float, ...] = ()  # continuous bounds (actions are clipped into them)
    high: tuple[float, ...] = ()
    n: int = 0  # discrete: actions are integers 0..n-1


@dataclass(frozen=True)
class EpisodeStats:
    ret: float
    length: int
    success: float | None  # None when the env has no notion of success


@dataclass
class StepResult:
    obs: Obs  # after auto-reset, [n, ...] per field
    rewards: np.ndarray  # [n] float32, summed over the chunk
    terminated: np.ndarray  # [n] bool: the episode ended in a terminal state (no bootstrap)
    truncated: np.ndarray  # [n] bool: cut by the time limit (bootstrap from final_obs)
    final_obs: Obs  # the truncated envs' last obs; other rows repeat obs
    episodes: list[EpisodeStats] = field(default_factory=list)


class VectorEnv(ABC):
    # What the env class can give, declared by each env; config checks read it (envs/factory.py).
    obs_modes: tuple[str, ...] = ("state",)  # the observation kinds `env.obs_mode` may pick

    obs_spec: dict[str, FieldSpec]
    action_spec: ActionSpec

    @classmethod
    @abstractmethod
    def from_config(cls, cfg: EnvConfig, num_envs: int, name: str) -> VectorEnv:
        """Build `num_envs` envs from the env section of a config; `name` is their owner, for errors."""

    def __init__(self, num_envs: int, name: str = "env"):
        if num_envs <= 0:
            raise ValueError(f"{name}: num_envs must be > 0, got {num_envs}")
        self.num_envs, self.name = num_envs, name  # name: who owns it (the env worker), for errors
        self._returns = np.zeros(num_envs)
        self._lengths = np.zeros(num_envs, dtype=np.int64)
        self._obs: list[Obs] = []

    # --- per-env hooks -----------------------------------------------------------------------------
    @abstractmethod
    def _reset_one(self, i: int, seed: int | None) -> Obs:
        """Reset env i (seeded when `seed` is given) and return its first obs."""

    @abstractmethod
    def _step_one(self, i: int, action: Any) -> tuple[Obs, float, bool, bool, dict]:
        """(obs, reward, terminated, truncated, info) of env i; info may hold 'is_success'."""

    def _get_env_state(self, i: int) -> dict:
        """Everything env i needs to continue bit-exactly (simulator state, RNG, step counters)."""
        raise NotImplementedError(f"{self.name}: {type(self).__name__} cannot save its env state")

    def _set_env_state(self, i: int, state: dict) -> None:
        raise NotImplementedError(f"{self.name}: {type(self).__name__} cannot restore an env state")

    def close(self) -> None:
        pass

    # --- checkpointing -----------------------------------------------------------------------------
    def get_state(self) -> dict:
        """Picklable state of all envs: after `set_state` on an env built with the same config, `step`
        continues exactly (same episodes, same auto-reset draws)."""
        if not self._obs:
            raise RuntimeError(f"{self.name}: get_state before reset")
        return {"num_envs": self.num_envs, "returns": self._returns.copy(), "lengths": self._lengths.copy(),
                "obs": [{k: v.copy() for k, v in o.items()} for o in self._obs],
                "envs": [self._get_env_state(i) for i in range(self.num_envs)]}

    def set_state(self, state: dict) -> None:
        if state["num_envs"] != self.num_envs:
            raise ValueError(f"{self.name}: the saved env state has {state['num_envs']} envs, this one "
                             f"{self.num_envs}")
        self._returns[:], self._lengths[:] = state["returns"], state["lengths"]
        self._obs = [{k: v.copy() for k, v in o.items()} for o in state["obs"]]
        for i, env_state in enumerate(state["envs"]):
            self._set_env_state(i, env_state)

    # --- the batched interface ----------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> Obs:
        self._obs = [self._reset_one(i, None if seed is None else seed + i) for i in range(self.num_envs)]
        self._returns[:] = 0
        self._lengths[:] = 0
        return self._stack(self._obs)

    def reset_seeds(self, seeds: list[int]) -> Obs:
        """Reset env i with `seeds[i]` (equal seeds: the same initial state, e.g. a GRPO group)."""
        if len(seeds) != self.num_envs:
            raise ValueError(f"{self.name}: {len(seeds)} seeds for {self.num_envs} envs")
        self._obs = [self._reset_one(i, int(s)) for i, s in enumerate(seeds)]
        self._returns[:] = 0
        self._lengths[:] = 0
        return self._stack(self._obs)

    def step(self, actions: np.ndarray) -> StepResult:
        if not self._obs:
            raise RuntimeError(f"{self.name}: step before reset")
        actions = self._check(actions)
        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float32)
        terminated, truncated = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        final, episodes = list(self._obs), []
        for i in range(n):
            success = None
            for action in actions[i]:  # the chunk, until the episode ends
                obs, reward, term, trunc, info = self._step_one(i, action)
                rewards[i] += reward
                self._returns[i] += reward
                self._lengths[i] += 1
                self._obs[i] = obs
                success = info.get("is_success", info.get("success", success))
                if term or trunc:
                    terminated[i], truncated[i] = term, trunc and not term
                    break
            if terminated[i] or truncated[i]:
                final[i] = self._obs[i]
                episodes.append(EpisodeStats(float(self._returns[i]), int(self._lengths[i]),
                                             None if success is None else float(success)))
                self._returns[i], self._lengths[i] = 0, 0
                self._obs[i] = self._reset_one(i, None)
            else:
                final[i] = self._obs[i]
        return StepResult(self._stack(self._obs), rewards, terminated, truncated, self._stack(final), episodes)

    # --- helpers -----------------------------------------------------------------------------------
    def _stack(self, obs: list[Obs]) -> Obs:
        return {k: np.stack([o[k] for o in obs]).astype(spec.dtype, copy=False) for k, spec in self.obs_spec.items()}

    def _check(self, actions: Any) -> np.ndarray:
        """Actions as [n, chunk, *shape]; a clear error naming this env's owner otherwise."""
        spec, n = self.action_spec, self.num_envs
        try:
            actions = np.asarray(actions, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{self.name}: actions are not numeric ({err})") from err
        single = (n, *spec.shape)
        if actions.shape == single:
            actions = actions[:, None]
        elif actions.ndim != len(single) + 1 or actions.shape[0] != n or actions.shape[2:] != spec.shape or actions.shape[1] < 1:
            raise ValueError(f"{self.name}: actions have shape {tuple(actions.shape)}; expected {single} or an action "
                             f"chunk ({n}, chunk, {', '.join(map(str, spec.shape))}) for {n} envs")
        if not np.isfinite(actions).all():
            bad = sorted({int(i) for i in np.argwhere(~np.isfinite(actions))[:, 0]})
            raise ValueError(f"{self.name}: actions contain NaN or inf (envs {bad[:8]})")
        if spec.kind == "discrete":
            if (actions != np.round(actions)).any() or actions.min() < 0 or actions.max() >= spec.n:
                raise ValueError(f"{self.name}: discrete actions must be integers in [0, {spec.n}), "
                                 f"got values in [{actions.min()}, {actions.max()}]")
            return actions.astype(np.int64)
        return np.clip(actions, spec.low, spec.high)
