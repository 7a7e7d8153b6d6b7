"""The env registry: `env.kind` names a `VectorEnv` class, so workers and runners name envs in config,
not code, and checks read what the class declares (`VectorEnv.obs_modes`).

The built-in envs are registered by import path: their simulators (gymnasium, MuJoCo) are imported
only when an env is built. To add an env, subclass `VectorEnv`, declare `obs_modes`, implement
`from_config`, and register it here by path (or `@ENV_REGISTRY.register("name")` on the class).
"""

from __future__ import annotations

from rlinf_like.envs.base import VectorEnv
from rlinf_like.envs.config import EnvConfig
from rlinf_like.utils.registry import Registry

ENV_REGISTRY: Registry[type[VectorEnv]] = Registry("env", key="env.kind")
ENV_REGISTRY.register("gym", "rlinf_like.envs.gym_env:GymVectorEnv")  # any gymnasium id (env.id) with a Box obs
ENV_REGISTRY.register("reach_colour", "rlinf_like.envs.reach_colour:ReachColourEnv")
ENV_REGISTRY.register("libero", "rlinf_like.envs.libero:LiberoEnv")  # env.id: a LIBERO suite; the [libero] extra
ENV_REGISTRY.register("maniskill", "rlinf_like.envs.maniskill:ManiSkillEnv")  # ManiSkill3 (env.id: PickCube-v1, ...)


__all__ = ["ENV_REGISTRY", "EnvConfig", "check_env_config", "env_class", "make_env"]


def env_class(kind: str) -> type[VectorEnv]:
    """The env class `env.kind=kind` picks; an unknown kind raises naming the key and the choices."""
    return ENV_REGISTRY.get(kind)


def check_env_config(cfg: EnvConfig, name: str = "env") -> type[VectorEnv]:
    """What the chosen env cannot give, refused by key before it is built; returns its class."""
    try:
        env = env_class(cfg.kind)
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    if cfg.obs_mode not in env.obs_modes:
        raise ValueError(f"{name}: env.obs_mode={cfg.obs_mode!r} is not one of {list(env.obs_modes)} "
                         f"(what env.kind={cfg.kind} gives)")
    return env


def make_env(cfg: EnvConfig, num_envs: int | None = None, name: str = "env") -> VectorEnv:
    env = check_env_config(cfg, name)
    return env.from_config(cfg, cfg.num_envs if num_envs is None else num_envs, name)
