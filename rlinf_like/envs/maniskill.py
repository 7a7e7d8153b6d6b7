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
from rlinf_like.envs.state import rng_state
from rlinf_like.envs.vulkan import INSTALL_HINT, no_vulkan_message, use_lavapipe

VOCAB = ("<pad>", "pick", "up", "the", "cube", "and", "move", "it", "to", "goal", "push", "stack", "on", "top", "of")
INSTRUCTION_LEN = 12
INSTRUCTIONS = {"PickCube-v1": "pick up the cube and move it to the goal",
                "PushCube-v1": "push the cube to the goal",
                "StackCube-v1": "stack the cube on top of the cube"}
# ManiSkill's own options an adapter user may pass through env.kwargs (others are refused by name)
MAKE_KWARGS = ("control_mode", "reward_mode", "robot_uids", "sim_backend", "render_backend", "sim_config")


def tokenize(text: str) -> np.ndarray:
    ids = [VOCAB.index(w) for w in text.split()][:INSTRUCTION_LEN]
    return np.array(ids + [0] * (INSTRUCTION_LEN - len(ids)), dtype=np.int64)


def import_maniskill(name: str):
    """gymnasium with ManiSkill's envs registered, lavapipe selected; a missing package named with its install."""
    use_lavapipe()  # before SAPIEN creates its first Vulkan instance
    try:
        import gymnasium as gym
        import mani_skill.envs  # noqa: F401  (registers the tasks with gymnasium)
    except ImportError as err:
        raise ImportError(f"{name}: env.kind=maniskill needs mani-skill ({err}); install it: {INSTALL_HINT}") from err
    return gym


def make_kwargs(cfg: EnvConfig, name: str) -> dict[str, Any]:
    unknown = sorted(set(cfg.kwargs) - set(MAKE_KWARGS))
    if unknown:
        raise ValueError(f"{name}: env.kwargs {unknown} are not ManiSkill options this adapter passes; "
                         f"known: {list(MAKE_KWARGS)}")
    kwargs = dict(cfg.kwargs)
    kwargs.setdefault("sim_backend", "auto")
    return kwargs


def wants_gpu(sim_backend: str, name: str) -> bool:
    import torch

    if sim_backend == "auto":
        return torch.cuda.is_available()
    if sim_backend in ("gpu", "cuda", "physx_cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"{name}: env.kwargs.sim_backend={sim_backend} needs a CUDA GPU; use auto or cpu")
        return True
    if sim_backend in ("cpu", "physx_cpu"):
        return False
    raise ValueError(f"{name}: env.kwargs.sim_backend={sim_backend!r} is not one of auto, cpu, gpu")


def make_task(gym, env_id: str, obs_mode: str, image_size: int, num_envs: int, sim_backend: str, name: str,
              **kwargs: Any):
    """One ManiSkill env (its batched BaseEnv, no gymnasium wrappers: we count the time limit ourselves)."""
    render = kwargs.pop("render_backend", "cpu" if sim_backend == "physx_cpu" else "gpu")
    try:
        env = gym.make(env_id, num_envs=num_envs, obs_mode="state" if obs_mode == "state" else "rgb",
                       sim_backend=sim_backend, render_backend=render, disable_env_checker=True,
                       sensor_configs=dict(width=image_size, height=image_size), **kwargs)
    except gym.error.Error as err:
        raise ValueError(f"{name}: cannot make ManiSkill env {env_id!r}: {err}") from err
    except RuntimeError as err:  # SAPIEN: ErrorIncompatibleDriver / failed to find a rendering device
        if "vk::" in str(err) or "rendering device" in str(err) or "Vulkan" in str(err):
            raise RuntimeError(f"{name}: {no_vulkan_message(err)}") from err
        raise
    return env.unwrapped


def pixel_obs(raw: dict, instruction: np.ndarray) -> dict[str, np.ndarray]:
    """ManiSkill's rgb observation [b, ...] -> image, proprio + task extras, instruction, per env."""
    cams = raw["sensor_data"]
    image = cams["base_camera" if "base_camera" in cams else next(iter(cams))]["rgb"]
    parts = [raw["agent"][k] for k in sorted(raw["agent"])] + [raw["extra"][k] for k in sorted(raw["extra"])]
    state = np.concatenate([np.asarray(p.cpu(), dtype=np.float32).reshape(len(image), -1) for p in parts], axis=1)
    n = len(image)
    return {"image": np.asarray(image.cpu(), dtype=np.uint8), "state": state,
            "instruction": np.broadcast_to(instruction, (n, len(instruction))).copy()}


def to_obs(raw: Any, obs_mode: str, instruction: np.ndarray) -> dict[str, np.ndarray]:
    if obs_mode == "state":
        return {"state": np.asarray(raw.cpu(), dtype=np.float32)}
    return pixel_obs(raw, instruction)


class ManiSkillEnv(VectorEnv):
    obs_modes = ("state", "pixels")

    @classmethod
    def from_config(cls, cfg: EnvConfig, num_envs: int, name: str) -> VectorEnv:
        kwargs = make_kwargs(cfg, name)
        if wants_gpu(kwargs["sim_backend"], name):
            from rlinf_like.envs.maniskill_gpu import ManiSkillGPUEnv

            return ManiSkillGPUEnv(cfg.id, num_envs, name, cfg.obs_mode, cfg.image_size, cfg.max_episode_steps,
                                   **{**kwargs, "sim_backend": "physx_cuda"})
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
        if seed is None:
            seed = int(self._rngs[i].integers(2**31))
        else:
            self._rngs[i] = np.random.default_rng(seed)
        self._episode_seed[i], self._actions[i] = int(seed), []
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
        self._rngs[i] = np.random.default_rng()
        self._rngs[i].bit_generator.state = state["rng"]

    def close(self) -> None:
        for env in self.envs:
            env.close()
