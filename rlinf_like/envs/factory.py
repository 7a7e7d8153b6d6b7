"""`EnvConfig` -> a VectorEnv, so workers and runners name envs in config, not code."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from rlinf_like.config.validate import bounded
from rlinf_like.envs.base import VectorEnv

KINDS = ("gym", "reach_colour")


@dataclass(kw_only=True)
class EnvConfig:
    kind: Literal[KINDS] = "gym"  # a gymnasium env or our reach_colour task
    id: str = "Reacher-v5"  # gymnasium id (kind=gym)
    num_envs: int = bounded(16, gt=0)  # per env worker rank
    max_episode_steps: int | None = None  # None: the env's own limit (reach_colour: 50)
    obs_mode: Literal["state", "pixels"] = "state"  # reach_colour: positions or rendered frames
    image_size: int = 48  # obs_mode=pixels: rendered frames are image_size x image_size
    kwargs: dict = field(default_factory=dict)  # passed to gymnasium.make; reach_colour: frame_skip


def make_env(cfg: EnvConfig, num_envs: int | None = None, name: str = "env") -> VectorEnv:
    n = cfg.num_envs if num_envs is None else num_envs
    if cfg.kind == "gym":
        from rlinf_like.envs.gym_env import GymVectorEnv

        return GymVectorEnv(cfg.id, n, name, cfg.max_episode_steps, **cfg.kwargs)
    if cfg.kind == "reach_colour":
        from rlinf_like.envs.reach_colour import ReachColourEnv

        unknown = sorted(set(cfg.kwargs) - {"frame_skip"})
        if unknown:
            raise ValueError(f"{name}: env.kwargs {unknown} are not options of reach_colour; allowed: ['frame_skip']")
        return ReachColourEnv(n, name, cfg.obs_mode, cfg.image_size, cfg.max_episode_steps or 50, **cfg.kwargs)
    raise ValueError(f"{name}: env.kind={cfg.kind!r} is not one of {list(KINDS)}")
