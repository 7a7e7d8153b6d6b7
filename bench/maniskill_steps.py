"""ManiSkill3 PickCube-v1 env steps/s through our adapter (`env.kind=maniskill`) versus ManiSkill itself.

Baseline: what a ManiSkill user gets on CPU: `gym.make("PickCube-v1", num_envs=1, sim_backend="physx_cpu",
render_backend="cpu")` stepped with torch actions, reset (seeded) every 50 steps. Ours: `ManiSkillEnv` with one
env, stepped with numpy actions (checks, clipping, numpy observations, episode stats, auto-reset). Same task,
control mode (pd_joint_delta_pos), reward (normalized_dense), the same pre-drawn actions on both sides, one core.
State observations, and pixels (ManiSkill's "rgb" mode, base camera at --image-size, SAPIEN through lavapipe on
CPU). Sides alternate (ours, theirs, theirs, ours, ...), env creation excluded; the ratio is of medians.
Last line: one JSON object; overhead_* = our time per step / ManiSkill's (target <= 1.1).

    python bench/maniskill_steps.py [--reps 3] [--state-steps 500] [--pixel-steps 100] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.common import Machine, median_ratio, result_line  # noqa: E402
from rlinf_like.envs.maniskill import ManiSkillEnv, import_maniskill  # noqa: E402

EPISODE = 50  # PickCube-v1's time limit


def time_ours(env: ManiSkillEnv, acts: np.ndarray) -> float:
    env.reset(seed=0)
    start = time.perf_counter()
    for a in acts:
        env.step(a[None])
    return time.perf_counter() - start


def time_theirs(env, acts: np.ndarray) -> float:
    env.reset(seed=0)
    batch = torch.from_numpy(acts[:, None].astype(np.float32))
    start = time.perf_counter()
    for t, a in enumerate(batch):
        env.step(a)
        if (t + 1) % EPISODE == 0:
            env.reset(seed=t)
    return time.perf_counter() - start


def measure(obs_mode: str, steps: int, reps: int, image_size: int) -> dict:
    gym = import_maniskill("bench")
    ours = ManiSkillEnv("PickCube-v1", 1, "bench", obs_mode, image_size, sim_backend="physx_cpu")
    theirs = gym.make("PickCube-v1", num_envs=1, obs_mode="state" if obs_mode == "state" else "rgb",
                      sim_backend="physx_cpu", render_backend="cpu", reward_mode="normalized_dense",
                      control_mode="pd_joint_delta_pos", sensor_configs=dict(width=image_size, height=image_size))
    acts = np.random.default_rng(0).uniform(-1, 1, size=(steps, 8))
    time_ours(ours, acts[:10]), time_theirs(theirs, acts[:10])  # warm-up: first render, caches
    times: dict[str, list[float]] = {"ours": [], "theirs": []}
    for rep in range(reps):
        order = ("ours", "theirs") if rep % 2 == 0 else ("theirs", "ours")
        for side in order:
            t = time_ours(ours, acts) if side == "ours" else time_theirs(theirs, acts)
            times[side].append(t)
            print(f"{obs_mode} rep {rep} {side}: {steps / t:.1f} steps/s ({t:.2f} s)", flush=True)
    ours.close()
    theirs.close()
    return {"overhead": median_ratio(times["ours"], times["theirs"]),
            "ours_steps_per_s": steps / statistics.median(times["ours"]),
            "theirs_steps_per_s": steps / statistics.median(times["theirs"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--state-steps", type=int, default=500)
    parser.add_argument("--pixel-steps", type=int, default=100)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--quick", action="store_true", help="fewer steps (CI / run_all --quick)")
    args = parser.parse_args()
    if args.quick:
        args.state_steps, args.pixel_steps = 100, 20
    torch.set_num_threads(1)
    machine = Machine.start(vars(args))
    state = measure("state", args.state_steps, args.reps, args.image_size)
    pixels = measure("pixels", args.pixel_steps, args.reps, args.image_size)
    machine.end()
    print(result_line("maniskill_steps", overhead_state=state["overhead"], overhead_pixels=pixels["overhead"],
                      steps_per_s_state=state["ours_steps_per_s"], steps_per_s_pixels=pixels["ours_steps_per_s"],
                      maniskill_steps_per_s_state=state["theirs_steps_per_s"],
                      maniskill_steps_per_s_pixels=pixels["theirs_steps_per_s"]))


if __name__ == "__main__":
    main()
