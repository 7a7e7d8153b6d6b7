"""Gymnasium adapter: `num_envs` gymnasium envs stepped in one process (a sync vector env; on 2
cores async subprocess envs were 4x slower, see FACTS). State observations under "state"."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlinf_like.envs.base import ActionSpec, FieldSpec, Obs, VectorEnv
from rlinf_like.envs.config import EnvConfig
from rlinf_like.envs.state import gym_env_state, set_gym_env_state


class GymVectorEnv(VectorEnv):
    obs_modes = ("state",)  # Box observation spaces only

    @classmethod
    def from_config(cls, cfg: EnvConfig, num_envs: int, name: str) -> GymVectorEnv:
        return cls(cfg.id, num_envs, name, cfg.max_episode_steps, **cfg.kwargs)

    def __init__(self, env_id: str, num_envs: int, name: str = "env", max_episode_steps: int | None = None,
                 **kwargs: Any):
        import gymnasium as gym

        super().__init__(num_envs, name)
        try:
            self.envs = [gym.make(env_id, max_episode_steps=max_episode_steps, **kwargs) for _ in range(num_envs)]
        except gym.error.Error as err:
            raise ValueError(f"{name}: cannot make gymnasium env {env_id!r}: {err}") from err
        obs_space, act_space = self.envs[0].observation_space, self.envs[0].action_space
        if not isinstance(obs_space, gym.spaces.Box):
            raise ValueError(f"{name}: {env_id} has observation space {obs_space}; the adapter takes a Box (state)")
        self.obs_spec = {"state": FieldSpec(tuple(obs_space.shape), "float32")}
        if isinstance(act_space, gym.spaces.Discrete):
            self.action_spec = ActionSpec("discrete", (), n=int(act_space.n))
        elif isinstance(act_space, gym.spaces.Box):
            self.action_spec = ActionSpec("continuous", tuple(act_space.shape), tuple(act_space.low.tolist()),
                                          tuple(act_space.high.tolist()))
        else:
            raise ValueError(f"{name}: {env_id} has action space {act_space}; the adapter takes Discrete or Box")
        self.env_id = env_id

    def _reset_one(self, i: int, seed: int | None) -> Obs:
        obs, _ = self.envs[i].reset(seed=seed)
        return {"state": np.asarray(obs, dtype=np.float32)}

    def _step_one(self, i: int, action: Any) -> tuple[Obs, float, bool, bool, dict]:
        a = int(action) if self.action_spec.kind == "discrete" else action.astype(np.float32)
        obs, reward, terminated, truncated, info = self.envs[i].step(a)
        return {"state": np.asarray(obs, dtype=np.float32)}, float(reward), bool(terminated), bool(truncated), info

    def _get_env_state(self, i: int) -> dict:
        return gym_env_state(self.envs[i])

    def _set_env_state(self, i: int, state: dict) -> None:
        set_gym_env_state(self.envs[i], state)

    def render(self, i: int = 0) -> np.ndarray | None:
        return self.envs[i].render()

    def close(self) -> None:
        for env in self.envs:
            env.close()
