"""What the ManiSkill3 adapters share (`envs/maniskill.py` on the CPU sim, `envs/maniskill_gpu.py` on the GPU sim):
the instruction vocabulary, ManiSkill's import (lavapipe selected first), the pass-through options, the choice of
sim backend, making one task, and turning its observations into ours."""

from __future__ import annotations

from typing import Any

import numpy as np

from rlinf_like.envs.config import EnvConfig
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


def episode_seed(rngs: list[np.random.Generator], i: int, seed: int | None) -> int:
    """The seed env i's next episode resets with: the given one (which also reseeds the env's generator, so the
    auto-resets after it follow from it), else the next draw of the env's generator."""
    if seed is None:
        return int(rngs[i].integers(2**31))
    rngs[i] = np.random.default_rng(seed)
    return int(seed)


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
