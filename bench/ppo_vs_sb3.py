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
construction) but include each side's first update. Each side runs in its own process; the sides alternate
(ours first on even seeds) over `--seeds` seeds.

The mean return of an update is the mean over the episodes that finished in its 2048 steps,
smoothed over 3 updates. Per seed the target is the lower of the two sides' best smoothed returns (so both
reach it); the time to target is when a side's smoothed return first reaches it.
Last line: one JSON object, time_ratio = median(ours) / median(SB3) time to target over the seeds (target
<= 1.0), the spread (min, max of the per-seed ratios), the per-update time ratio, and the median final
returns at the same step budget.

    python bench/ppo_vs_sb3.py --quick
    python bench/ppo_vs_sb3.py [--steps 20480] [--seeds 3]
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
# SB3 2.9's PPO, every setting that matters explicit; comments mark where SB3's default differs.
SB3_SETTINGS = dict(
    n_steps=T,  # 256 per env x 8 envs = 2048 per update (default 2048 per env)
    batch_size=ENVS * T // 32, n_epochs=10, learning_rate=3e-4, gamma=0.99, gae_lambda=0.95, clip_range=0.2,
    clip_range_vf=None, normalize_advantage=True, ent_coef=0.0, vf_coef=0.5, max_grad_norm=0.5,
    use_sde=False, target_kl=None,
    policy_kwargs=dict(net_arch=dict(pi=[64, 64], vf=[64, 64]), activation_fn="tanh", ortho_init=True,
                       log_std_init=0.0, share_features_extractor=False),
)


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
    kwargs = dict(SB3_SETTINGS, policy_kwargs=dict(SB3_SETTINGS["policy_kwargs"], activation_fn=torch.nn.Tanh))

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
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
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


def run_side(side: str, steps: int, seed: int, tmp: Path) -> list[tuple[int, float, float]]:
    """One side in a fresh process (this script with --side), so neither inherits the other's state."""
    if side == "ours":
        return run_ours(steps, seed, tmp / f"ours_{seed}")
    cmd = [sys.executable, __file__, "--side", "sb3", f"--steps={steps}", f"--seeds={seed}"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=1200,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    if done.returncode:
        raise RuntimeError(f"SB3 failed:\n{done.stderr[-3000:]}")
    return [tuple(p) for p in json.loads(done.stdout.strip().splitlines()[-1])]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20_480, help="env steps per side (10 updates of 2048)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1 seed, 3 updates: a smoke run")
    parser.add_argument("--side", choices=["sb3"], help=argparse.SUPPRESS)  # internal: one SB3 run, --seeds = its seed
    args = parser.parse_args()
    if args.side:
        print(json.dumps(run_sb3(args.steps, args.seeds)))
        return
    if args.quick:
        args.steps, args.seeds = 3 * ENVS * T, 1
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start; {args.seeds} seeds x "
          f"{args.steps} env steps; SB3 settings {SB3_SETTINGS}", flush=True)
    ratios, times, finals, per_update = [], {"ours": [], "SB3": []}, {"ours": [], "SB3": []}, {"ours": [], "SB3": []}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            curves = {}
            for side in (["ours", "SB3"] if seed % 2 == 0 else ["SB3", "ours"]):
                curves[side] = smooth(run_side(side, args.steps, seed, Path(tmp)))
                print(f"seed {seed} {side:>4}: " + "  ".join(f"{s // 1000}k/{t:.0f}s:{r:.1f}"
                      for s, t, r in curves[side][::5] + curves[side][-1:]) + f"; load {os.getloadavg()[0]:.2f}",
                      flush=True)
            target = min(max(p[2] for p in curves["ours"]), max(p[2] for p in curves["SB3"]))
            hit = {side: time_to(points, target) for side, points in curves.items()}
            for side, points in curves.items():
                times[side].append(hit[side][0])
                finals[side].append(points[-1][2])
                per_update[side].append(points[-1][1] / len(points))
            ratios.append(hit["ours"][0] / hit["SB3"][0])
            print(f"seed {seed}: target smoothed return {target:.2f}: ours {hit['ours'][0]:.1f} s ({hit['ours'][1]} "
                  f"steps), SB3 {hit['SB3'][0]:.1f} s ({hit['SB3'][1]} steps); ratio {ratios[-1]:.3f}; per update "
                  f"ours {per_update['ours'][-1]:.2f} s, SB3 {per_update['SB3'][-1]:.2f} s", flush=True)
    med = {k: {side: float(np.median(v)) for side, v in d.items()} for k, d in
           (("time", times), ("final", finals), ("per_update", per_update))}
    print(f"median time to target: ours {med['time']['ours']:.1f} s, SB3 {med['time']['SB3']:.1f} s; per-seed ratios "
          f"{[round(r, 3) for r in ratios]}; load average {os.getloadavg()[0]:.2f} at end")
    print(json.dumps({"bench": "ppo_vs_sb3", "time_ratio": round(med["time"]["ours"] / med["time"]["SB3"], 3),
                      "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
                      "per_update_ratio": round(med["per_update"]["ours"] / med["per_update"]["SB3"], 3),
                      "ours_return": round(med["final"]["ours"], 2), "sb3_return": round(med["final"]["SB3"], 2),
                      "seeds": args.seeds, "env_steps": args.steps}))


if __name__ == "__main__":
    main()
