"""`EnvConfig`, the env section of a config (a leaf module: the registry and every env read it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_like.config.validate import bounded


@dataclass(kw_only=True)
class EnvConfig:
    kind: str = "gym"  # a name in ENV_REGISTRY (envs/factory.py): gym | reach_colour | libero | maniskill
    # gymnasium id (kind=gym); kind=libero: the task suite (e.g. libero_spatial); kind=maniskill: the task (PickCube-v1)
    id: str = "Reacher-v5"
    num_envs: int = bounded(16, gt=0)  # per env worker rank
    max_episode_steps: int | None = None  # None: the env's own limit (reach_colour: 50, PickCube-v1: 50)
    obs_mode: str = "state"  # one of the env class's `obs_modes` (reach_colour, maniskill: state | pixels)
    image_size: int = bounded(48, gt=0)  # obs_mode=pixels: rendered frames are image_size x image_size
    # gymnasium.make's; reach_colour: frame_skip; libero: task_ids, wrist_camera; maniskill: maniskill.MAKE_KWARGS
    kwargs: dict = field(default_factory=dict)
