"""ManiSkill3 on its GPU simulation (`physx_cuda`): all `num_envs` envs in one batched scene, stepped together.

`env.kind=maniskill` picks it when CUDA is available (`env.kwargs.sim_backend=auto|gpu`). Same interface and
observations as the CPU adapter (`envs/maniskill.py`); what differs:
- A step advances every env at once (chunk element by chunk element); an env whose episode ended inside a chunk
  is stepped on with its last action until the chunk ends, uncounted, and reset after it.
- Resets are partial (`options.env_idx`), one env at a time, each with its own seed, so a seed gives the same
  initial state in any env slot (ManiSkill seeds one batched draw by the first env's seed otherwise).
- Checkpoints hold ManiSkill's state dict (poses, velocities), the controller state, the step counters and the
  seed generators. GPU PhysX does not restore its solver caches, so a resumed run is close to, not bit-equal
  with, the uninterrupted one (the CPU adapter replays episodes for exactness; here the envs share one scene).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlinf_like.envs.base import ActionSpec, EpisodeStats, FieldSpec, Obs, StepResult, VectorEnv
from rlinf_like.envs.config import EnvConfig
from rlinf_like.envs.maniskill_task import (INSTRUCTIONS, episode_seed, import_maniskill, make_kwargs, make_task,
                                            to_obs, tokenize)
from rlinf_like.envs.state import rng_state


def _to_cpu(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    return tree.detach().cpu().clone() if hasattr(tree, "detach") else tree


class ManiSkillGPUEnv(VectorEnv):
    obs_modes = ("state", "pixels")

    @classmethod
    def from_config(cls, cfg: EnvConfig, num_envs: int, name: str) -> VectorEnv:
        return cls(cfg.id, num_envs, name, cfg.obs_mode, cfg.image_size, cfg.max_episode_steps,
                   **{**make_kwargs(cfg, name), "sim_backend": "physx_cuda"})

    def __init__(self, env_id: str = "PickCube-v1", num_envs: int = 1, name: str = "env", obs_mode: str = "state",
                 image_size: int = 64, max_episode_steps: int | None = None, **kwargs: Any):
        super().__init__(num_envs, name)
        gym = import_maniskill(name)
        kwargs = {"sim_backend": "physx_cuda", **kwargs}
        self.env = make_task(gym, env_id, obs_mode, image_size, num_envs, name=name, **kwargs)
        self.env_id, self.obs_mode = env_id, obs_mode
        self.max_episode_steps = int(max_episode_steps or gym.spec(env_id).max_episode_steps or 100)
        self.instruction = tokenize(INSTRUCTIONS.get(env_id, ""))
        act = self.env.single_action_space
        self.action_spec = ActionSpec("continuous", tuple(act.shape), tuple(act.low.tolist()), tuple(act.high.tolist()))
        first = to_obs(self.env.reset(seed=0)[0], obs_mode, self.instruction)
        self.obs_spec = {k: FieldSpec(tuple(v.shape[1:]), str(v.dtype)) for k, v in first.items()}
        self._rngs = [np.random.default_rng() for _ in range(num_envs)]

    def _reset_one(self, i: int, seed: int | None) -> Obs:
        import torch

        seed = episode_seed(self._rngs, i, seed)
        idx = torch.tensor([i], device=self.env.device)
        obs, _ = self.env.reset(seed=[int(seed)], options={"env_idx": idx})
        return {k: v[i] for k, v in to_obs(obs, self.obs_mode, self.instruction).items()}

    def _step_one(self, i: int, action: Any) -> tuple[Obs, float, bool, bool, dict]:
        raise NotImplementedError("ManiSkillGPUEnv steps all envs at once (step)")

    def step(self, actions: np.ndarray) -> StepResult:
        import torch

        if not self._obs:
            raise RuntimeError(f"{self.name}: step before reset")
        actions = self._check(actions)  # [n, chunk, dim]
        n = self.num_envs
        rewards = np.zeros(n, dtype=np.float32)
        terminated, truncated, done = (np.zeros(n, dtype=bool) for _ in range(3))
        success: list[float | None] = [None] * n
        for k in range(actions.shape[1]):
            a = torch.as_tensor(actions[:, k], dtype=torch.float32, device=self.env.device)
            raw, reward, term, _, info = self.env.step(a)
            obs = to_obs(raw, self.obs_mode, self.instruction)
            reward, term = reward.cpu().numpy(), term.cpu().numpy().astype(bool)
            won = info["success"].cpu().numpy() if "success" in info else None
            for i in np.flatnonzero(~done):
                rewards[i] += reward[i]
                self._returns[i] += reward[i]
                self._lengths[i] += 1
                self._obs[i] = {key: v[i] for key, v in obs.items()}
                success[i] = None if won is None else float(won[i])
                trunc = self._lengths[i] >= self.max_episode_steps
                if term[i] or trunc:
                    terminated[i], truncated[i], done[i] = term[i], trunc and not term[i], True
            if done.all():
                break
        final, episodes = list(self._obs), []
        for i in np.flatnonzero(done):
            episodes.append(EpisodeStats(float(self._returns[i]), int(self._lengths[i]), success[i]))
            self._returns[i], self._lengths[i] = 0, 0
            self._obs[i] = self._reset_one(i, None)
        return StepResult(self._stack(self._obs), rewards, terminated, truncated, self._stack(final), episodes)

    # --- checkpoints: the whole scene at once (close, not bit-exact: see the module docstring) ------------
    def get_state(self) -> dict:
        state = super().get_state()
        state["scene"] = _to_cpu(self.env.get_state_dict())
        state["elapsed"] = self.env._elapsed_steps.cpu().clone()
        return state

    def set_state(self, state: dict) -> None:
        super().set_state(state)
        scene = {k: v for k, v in state["scene"].items() if k != "controller"}
        device = self.env.device
        self.env.set_state_dict({k: {a: t.to(device) for a, t in v.items()} for k, v in scene.items()})
        if "controller" in state["scene"]:
            self.env.agent.set_controller_state(state["scene"]["controller"])
        self.env._elapsed_steps[:] = state["elapsed"].to(device)

    def _get_env_state(self, i: int) -> dict:
        return {"rng": rng_state(self._rngs[i])}

    def _set_env_state(self, i: int, state: dict) -> None:
        self._rngs[i].bit_generator.state = state["rng"]

    def close(self) -> None:
        self.env.close()
