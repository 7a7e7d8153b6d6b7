"""A short GIF of one episode of the final policy, played in the driver (deterministic actions)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from rlinf_like.envs import make_env
from rlinf_like.models.policies import build_policy
from rlinf_like.workers.env.types import EnvSpecs


def write_gif(cfg, weights: dict[str, torch.Tensor], specs: EnvSpecs, path: Path, max_steps: int = 100) -> None:
    from PIL import Image

    env_cfg = replace(cfg.env, kwargs={**cfg.env.kwargs, "render_mode": "rgb_array"}) if cfg.env.kind == "gym" else cfg.env
    env = make_env(env_cfg, 1, "gif")
    policy = build_policy(cfg.policy, specs.obs_spec, specs.action_spec)
    policy.load_state_dict(weights, strict=False)
    obs, frames = env.reset(cfg.runner.seed + 12345), []
    with torch.no_grad():
        for _ in range(max_steps):
            frame = env.frame(0) if hasattr(env, "frame") else env.render(0)
            frames.append(Image.fromarray(frame))
            actions = policy({k: torch.as_tensor(obs[k]) for k in policy.obs_keys}, deterministic=True)[0]
            result = env.step(policy.env_actions(actions))
            obs = result.obs
            if result.episodes:
                break
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=60, loop=0)
    env.close()
