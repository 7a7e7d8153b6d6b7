"""ManiSkill3 adapter (`env.kind=maniskill`, `mani-skill` 3.0.1 / SAPIEN 3): PickCube-v1 and other tabletop tasks.

On CPU, ManiSkill's PhysX CPU backend holds one env per scene, so this keeps `num_envs` single-env scenes and
steps them in-process (like the gymnasium adapter). With a CUDA GPU, `env.kwargs.sim_backend=auto` (the
default) picks ManiSkill's batched GPU simulation instead (`envs/maniskill_gpu.py`).

Observations: `obs_mode=state` is ManiSkill's flat state vector ("state"); `obs_mode=pixels` is its "rgb" mode:
the base camera ("image", HxWx3 uint8, `env.image_size`), the robot's proprioception plus the task's extras
("state": qpos, qvel, tcp pose, goal, ...) and a tokenized instruction ("instruction"), as `policy=vla` reads.

Episodes: ManiSkill ends an episode on success (terminated) and we cut it at the task's time limit (PickCube: 50
steps; `env.max_episode_steps` overrides). Every reset is seeded: auto-resets draw the next episode's seed from
a per-env generator seeded by the last explicit seed, because an unseeded ManiSkill reset draws from torch's
global RNG. A seed fixes the episode's initial state whatever ran before (checked in tests).

Checkpoints: ManiSkill's `set_state_dict` restores poses and velocities, but not the controller targets or
PhysX's solver caches, and a restored env drifted (~5e-6 after 25 steps). So an env's checkpoint is its episode:
the seed and the actions taken since; restoring resets with that seed and replays the actions (physics only,
no rendering), which continues bit-exactly (PhysX CPU is deterministic); at most one episode of replay per env.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlinf_like.envs.base import ActionSpec, FieldSpec, Obs, VectorEnv
from rlinf_like.envs.config import EnvConfig
from rlinf_like.envs.maniskill_gpu import ManiSkillGPUEnv
from rlinf_like.envs.maniskill_task import (INSTRUCTIONS, MAKE_KWARGS, episode_seed, import_maniskill,  # noqa: F401
                                            make_kwargs, make_task, to_obs, tokenize, wants_gpu)
from rlinf_like.envs.state import rng_state


class ManiSkillEnv(VectorEnv):
    obs_modes = ("state", "pixels")

    @classmethod
    def from_config(cls, cfg: EnvConfig, num_envs: int, name: str) -> VectorEnv:
        kwargs = make_kwargs(cfg, name)
        if wants_gpu(kwargs["sim_backend"], name):
            return ManiSkillGPUEnv.from_config(cfg, num_envs, name)
        return cls(cfg.id, num_envs, name, cfg.obs_mode, cfg.image_size, cfg.max_episode_steps,
                   **{**kwargs, "sim_backend": "physx_cpu"})

    def __init__(self, env_id: str = "PickCube-v1", num_envs: int = 1, name: str = "env", obs_mode: str = "state",
                 image_size: int = 64, max_episode_steps: int | None = None, **kwargs: Any):
        super().__init__(num_envs, name)
        if obs_mode not in self.obs_modes:
            raise ValueError(f"{name}: env.obs_mode={obs_mode!r} is not one of {list(self.obs_modes)}")
        gym = import_maniskill(name)
        kwargs = {"sim_backend": "physx_cpu", **kwargs}
        self.envs = [make_task(gym, env_id, obs_mode, image_size, 1, name=name, **kwargs) for _ in range(num_envs)]
        self.env_id, self.obs_mode = env_id, obs_mode
        self.max_episode_steps = int(max_episode_steps or gym.spec(env_id).max_episode_steps or 100)
        self.instruction = tokenize(INSTRUCTIONS.get(env_id, ""))
        act = self.envs[0].single_action_space
        self.action_spec = ActionSpec("continuous", tuple(act.shape), tuple(act.low.tolist()), tuple(act.high.tolist()))
        first = self._convert(self.envs[0].reset(seed=0)[0])
        self.obs_spec = {k: FieldSpec(tuple(v.shape), str(v.dtype)) for k, v in first.items()}
        self._rngs = [np.random.default_rng() for _ in range(num_envs)]  # auto-reset seeds; reseeded by reset(seed)
        self._episode_seed = [0] * num_envs
        self._actions: list[list[np.ndarray]] = [[] for _ in range(num_envs)]

    def _convert(self, raw: Any) -> Obs:
        return {k: v[0] for k, v in to_obs(raw, self.obs_mode, self.instruction).items()}

    def _reset_one(self, i: int, seed: int | None) -> Obs:
        seed = episode_seed(self._rngs, i, seed)
        self._episode_seed[i], self._actions[i] = seed, []
        obs, _ = self.envs[i].reset(seed=int(seed))
        return self._convert(obs)

    def _step_one(self, i: int, action: Any) -> tuple[Obs, float, bool, bool, dict]:
        import torch

        a = np.asarray(action, dtype=np.float32)
        self._actions[i].append(a)
        obs, reward, terminated, _, info = self.envs[i].step(torch.from_numpy(a[None]))
        truncated = len(self._actions[i]) >= self.max_episode_steps
        return (self._convert(obs), float(reward[0]), bool(terminated[0]), truncated,
                {"success": bool(info["success"][0])} if "success" in info else {})

    # --- checkpoints: the episode's seed and actions, replayed -------------------------------------
    def _get_env_state(self, i: int) -> dict:
        actions = np.stack(self._actions[i]) if self._actions[i] else np.zeros((0, *self.action_spec.shape), np.float32)
        return {"seed": self._episode_seed[i], "actions": actions, "rng": rng_state(self._rngs[i])}

    def _set_env_state(self, i: int, state: dict) -> None:
        import torch

        env = self.envs[i]
        env.reset(seed=int(state["seed"]))
        for a in np.asarray(state["actions"], dtype=np.float32):
            env._step_action(torch.from_numpy(a[None]))  # the physics of step() without rendering an observation
            env._elapsed_steps += 1
        self._episode_seed[i], self._actions[i] = int(state["seed"]), list(np.asarray(state["actions"], np.float32))
        self._rngs[i].bit_generator.state = state["rng"]

    def close(self) -> None:
        for env in self.envs:
            env.close()
