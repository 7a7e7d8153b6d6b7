"""Behaviour-cloning warm start for the VLA on reach_colour (pixels): a scripted expert with
privileged state (full force towards the named target) drives the envs; the policy learns to
predict the expert's action tokens from pixels + instruction (cross-entropy = -log p(expert
tokens)); the weights go to a file that PPO starts from (`policy.init_weights=...`).

    python examples/embodied/bc_warmstart.py --out runs/bc/vla.pt
    python examples/embodied/main_embodied.py env=reach_colour_pixels policy=vla policy.init_weights=runs/bc/vla.pt \\
        algorithm.lr=3e-4

To visit states the expert alone would not, a fraction `--noise` of the executed actions are
random (the labels stay the expert's). The env and policy settings must match the PPO preset's.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

from rlinf_like.envs import EnvConfig, make_env
from rlinf_like.models.policies import PolicyConfig, build_policy
from rlinf_like.utils.logging import setup_logging


def collect(env, policy, steps: int, noise: float, rng: np.random.Generator) -> tuple[dict, torch.Tensor, float]:
    obs, frames, labels, successes = env.reset(int(rng.integers(1 << 30))), [], [], []
    for _ in range(steps):
        expert = env.expert_actions()
        frames.append({k: torch.from_numpy(np.array(obs[k])) for k in policy.obs_keys})
        labels.append(policy.tokens(expert))
        act = np.where(rng.random((env.num_envs, 1)) < noise, rng.uniform(-1, 1, expert.shape), expert)
        result = env.step(act)
        obs = result.obs
        successes += [e.success for e in result.episodes]
    batch = {k: torch.cat([f[k] for f in frames]) for k in policy.obs_keys}
    return batch, torch.cat(labels), float(np.mean(successes)) if successes else float("nan")


@torch.no_grad()
def evaluate(env, policy, steps: int, seed: int) -> float:
    obs, successes = env.reset(seed), []
    for _ in range(steps):
        actions = policy({k: torch.from_numpy(np.array(obs[k])) for k in policy.obs_keys})[0]
        result = env.step(policy.env_actions(actions))
        obs = result.obs
        successes += [e.success for e in result.episodes]
    return float(np.mean(successes)) if successes else float("nan")


def main() -> None:
    setup_logging()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/bc/vla.pt")
    p.add_argument("--steps", type=int, default=200, help="expert steps per env")
    p.add_argument("--num-envs", type=int, default=16)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--noise", type=float, default=0.3)
    p.add_argument("--image-size", type=int, default=32)
    p.add_argument("--frame-skip", type=int, default=4)
    p.add_argument("--max-episode-steps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    rng = np.random.default_rng(a.seed)
    env = make_env(EnvConfig(kind="reach_colour", obs_mode="pixels", image_size=a.image_size, num_envs=a.num_envs,
                             max_episode_steps=a.max_episode_steps, kwargs={"frame_skip": a.frame_skip}), name="bc")
    policy = build_policy(PolicyConfig(kind="vla"), env.obs_spec, env.action_spec)
    start = time.perf_counter()
    before = evaluate(env, policy, 60, a.seed + 1)
    batch, labels, expert_success = collect(env, policy, a.steps, a.noise, rng)
    collect_s = time.perf_counter() - start
    opt = torch.optim.Adam(policy.parameters(), lr=a.lr)
    n = labels.shape[0]
    for epoch in range(a.epochs):
        losses = []
        for idx in torch.randperm(n).split(a.batch):
            _, logprobs, _, _ = policy({k: v[idx] for k, v in batch.items()}, labels[idx])
            loss = -logprobs.mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        print(f"epoch {epoch + 1}: loss {np.mean(losses):.3f}", flush=True)
    after = evaluate(env, policy, 60, a.seed + 1)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(policy.state_dict(), a.out)
    print(json.dumps({"bench": "vla_bc_warmstart", "frames": n, "expert_success": expert_success,
                      "success_before": before, "success_after": after, "collect_s": round(collect_s, 1),
                      "total_s": round(time.perf_counter() - start, 1), "out": a.out}))


if __name__ == "__main__":
    main()
