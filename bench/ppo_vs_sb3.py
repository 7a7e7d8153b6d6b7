"""Wall time to the same mean return on Reacher-v5: our embodied runner versus Stable-Baselines3 PPO.

Same env (gymnasium Reacher-v5, 8 envs, env i seeded with seed + i), same env-step budget, same
PPO settings: 256 steps per env per update (2048 samples), 10 epochs x 32 mini-batches of 64,
lr 3e-4, Adam eps 1e-5, gamma 0.99, GAE lambda 0.95, clip 0.2, no value clipping, the critic's
squared error weighted 0.5 (SB3: vf_coef 0.5 x MSE; ours: vf_coef 1.0 x our value_loss, which is
0.5 x MSE), no entropy bonus, grad-norm clip 0.5, advantages normalized per mini-batch, separate
tanh [64, 64] actor and critic with a state-independent log std starting at 0 (SB3's MlpPolicy
default, which our `policy=mlp` preset copies), actions sampled unclipped and clipped to the bounds
only for the env, time-limit truncations bootstrapped from V(final obs) on both sides, no obs
normalization on either. Ours runs the hydra example's Reacher preset: the rollout worker steps the
8 envs in its own process (`runner.env_in_rollout`, as SB3's DummyVecEnv does; no env worker, no
per-step handoff between processes) and the actor trains in another; one thread each. The actor's
FSDPModelManager keeps a single fp32 rank a plain module (no FSDP/DTensor overhead per step). SB3
runs in one process with one torch thread. Both clocks exclude startup (our Ray launch; SB3's model
construction) but include each side's first update.

The mean return of an update is the mean over the episodes that finished in its 2048 steps,
smoothed over 3 updates. The target is the lower of the two sides' best smoothed returns (so both
reach it); the time to target is when a side's smoothed return first reaches it.
Last line: one JSON object, time_ratio = ours / SB3 (target <= 1.0), plus both final returns at
the same step budget.

    python bench/ppo_vs_sb3.py [--steps 102400] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "examples" / "embodied" / "main_embodied.py"
ENVS, T, SMOOTH = 8, 256, 3


def run_ours(steps: int, seed: int, out: Path) -> list[tuple[int, float, float]]:
    """(env steps, elapsed s, mean episode return) per update."""
    cmd = [sys.executable, str(MAIN), "env=reacher", "policy=mlp", f"runner.total_env_steps={steps}",
           f"runner.seed={seed}", f"runner.output_dir={out}", "runner.save_every=1000"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1200,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise RuntimeError(f"ours failed:\n{done.stderr[-3000:]}")
    history = json.loads((out / "checkpoint" / "runner.json").read_text())["history"]
    collect, train = (float(np.median([h[k] for h in history[1:]])) for k in ("collect_s", "train_s"))
    print(f"ours: {time.perf_counter() - start:.0f} s including Ray start and worker launch; per update "
          f"(median) collect {collect:.2f} s, train {train:.2f} s", flush=True)
    return [(h["env_steps"], h["elapsed_s"], h["episode_return"]) for h in history]


def run_sb3(steps: int, seed: int) -> list[tuple[int, float, float]]:
    import gymnasium as gym
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    torch.set_num_threads(1)

    class PerUpdate(BaseCallback):
        """One point per update, stamped after its training (as our runner's elapsed_s is)."""

        def __init__(self):
            super().__init__()
            self.points, self.returns, self.pending, self.start = [], [], None, 0.0

        def _on_training_start(self) -> None:
            self.start = time.perf_counter()

        def _on_step(self) -> bool:
            self.returns += [info["episode"]["r"] for info in self.locals["infos"] if "episode" in info]
            return True

        def _on_rollout_end(self) -> None:  # this update's data is in; its training comes next
            self.pending, self.returns = (self.num_timesteps, float(np.mean(self.returns))), []

        def _on_rollout_start(self) -> None:  # the previous update's training is done
            self._close()

        def _on_training_end(self) -> None:
            self._close()

        def _close(self) -> None:
            if self.pending:
                steps, ret = self.pending
                self.points.append((steps, time.perf_counter() - self.start, ret))
                self.pending = None

    env = make_vec_env(lambda: gym.make("Reacher-v5"), n_envs=ENVS, seed=seed)
    model = PPO("MlpPolicy", env, n_steps=T, batch_size=ENVS * T // 32, n_epochs=10, learning_rate=3e-4,
                gamma=0.99, gae_lambda=0.95, clip_range=0.2, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
                seed=seed, device="cpu", verbose=0)
    callback = PerUpdate()
    model.learn(total_timesteps=steps, callback=callback)
    return callback.points


def smooth(points: list[tuple[int, float, float]]) -> list[tuple[int, float, float]]:
    returns = np.array([p[2] for p in points])
    return [(s, t, float(returns[max(0, i - SMOOTH + 1): i + 1].mean())) for i, (s, t, _) in enumerate(points)]


def time_to(points: list[tuple[int, float, float]], target: float) -> tuple[float, int]:
    for steps, elapsed, ret in points:
        if ret >= target:
            return elapsed, steps
    return points[-1][1], points[-1][0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=102_400, help="env steps per side (50 updates of 2048)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ours = smooth(run_ours(args.steps, args.seed, Path(tmp) / "ours"))
    sb3 = smooth(run_sb3(args.steps, args.seed))
    for name, points in (("ours", ours), ("SB3", sb3)):
        print(f"{name:>4}: " + "  ".join(f"{s // 1000}k/{t:.0f}s:{r:.1f}" for s, t, r in points[::5] + points[-1:]))
    target = min(max(p[2] for p in ours), max(p[2] for p in sb3))
    (ours_s, ours_steps), (sb3_s, sb3_steps) = time_to(ours, target), time_to(sb3, target)
    print(f"target smoothed return {target:.2f}: ours {ours_s:.1f} s ({ours_steps} steps), "
          f"SB3 {sb3_s:.1f} s ({sb3_steps} steps); ratio {ours_s / sb3_s:.3f}")
    print(f"at {args.steps} env steps: ours {ours[-1][2]:.2f} ({ours[-1][1]:.0f} s), SB3 {sb3[-1][2]:.2f} "
          f"({sb3[-1][1]:.0f} s)")
    print(json.dumps({"bench": "ppo_vs_sb3", "time_ratio": round(ours_s / sb3_s, 3), "target_return": round(target, 2),
                      "ours_return": round(ours[-1][2], 2), "sb3_return": round(sb3[-1][2], 2),
                      "env_steps": args.steps, "ours_s": round(ours[-1][1], 1), "sb3_s": round(sb3[-1][1], 1)}))


if __name__ == "__main__":
    main()
