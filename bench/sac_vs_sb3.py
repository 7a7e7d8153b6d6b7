"""Our SAC versus Stable-Baselines3's SAC on HalfCheetah-v5: time for the same env-step budget, and the return
each reaches.

Ours is the one-process loop (`bench/sac_local.py`: the env adapter, `ReplayBuffer` and `SACLearner` the
worker runner also uses); SB3 runs `SAC.learn` on one gymnasium env, as its users do. Matched hyperparameters,
every SB3 default that differs from ours (or that we change) set explicitly: lr 3e-4 (Adam, eps 1e-8) for
actor, critics and temperature, buffer = the whole budget (both preallocated), batch 256, tau 0.005, gamma 0.99,
one gradient step per env step, target update every step, temperature auto from 1.0, target entropy -6,
no gSDE, 2 critics, [256, 256] ReLU nets, `learning_starts` uniform random steps, 1-step returns, CPU, one
thread. Each run is a fresh subprocess; sides alternate (ours, sb3, ours, ...) over the seeds. Time is the
process's CPU seconds (user + system) for the whole learning loop; on a shared 2-core VM the wall clock
(printed too) mostly measures the neighbours. Return: the mean of 3 deterministic evaluation episodes after
learning (same eval seeds for both). The budget is cut to fit a ~6 min measurement slot (HalfCheetah
is usually trained for 1M steps): the returns compare early learning, not final performance.
Last line: {"bench": "sac_vs_sb3", "time_ratio": ours/sb3 of the median CPU times, "return_ours", "return_sb3"}
(median returns).

    python bench/sac_vs_sb3.py [--steps 5000] [--seeds 3]
    python bench/sac_vs_sb3.py --quick   # 600 steps, small nets, one seed per side
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ENV = "HalfCheetah-v5"


def evaluate(act, seed: int, episodes: int = 3) -> float:
    import gymnasium as gym

    env, returns = gym.make(ENV), []
    for e in range(episodes):
        obs, _ = env.reset(seed=10_000 + seed * 10 + e)
        done, total = False, 0.0
        while not done:
            obs, r, term, trunc, _ = env.step(act(obs))
            total, done = total + float(r), term or trunc
        returns.append(total)
    return float(np.mean(returns))


def run_ours(args) -> dict:
    from rlinf_like.envs import EnvConfig
    from bench.sac_local import run_local_sac
    from rlinf_like.workers.actor.sac_learner import SACConfig

    sac = SACConfig(tau=0.005, batch_size=256, buffer_size=args.steps, learning_starts=args.learning_starts, utd=1.0,
                    n_step=1, init_alpha=1.0, target_entropy=None)
    cpu = time.process_time()
    result = run_local_sac(EnvConfig(kind="gym", id=ENV, num_envs=1), sac, total_env_steps=args.steps,
                           hidden=args.hidden, gamma=0.99, lr=3e-4, seed=args.seed, adam_eps=1e-8)
    cpu = time.process_time() - cpu
    policy = result.learner.policy

    def act(obs):
        with torch.no_grad():
            a = policy({"state": torch.as_tensor(obs, dtype=torch.float32)[None]}, deterministic=True)[0]
        return policy.env_actions(a)[0]

    return {"cpu_s": cpu, "wall_s": result.wall_s, "updates": result.updates, "return": evaluate(act, args.seed)}


def run_sb3(args) -> dict:
    import gymnasium as gym
    from stable_baselines3 import SAC

    model = SAC("MlpPolicy", gym.make(ENV), learning_rate=3e-4, buffer_size=args.steps,
                learning_starts=args.learning_starts, batch_size=256, tau=0.005, gamma=0.99, train_freq=1,
                gradient_steps=1, n_steps=1, ent_coef="auto_1.0", target_update_interval=1, target_entropy="auto",
                use_sde=False, optimize_memory_usage=False, device="cpu", seed=args.seed, verbose=0,
                policy_kwargs=dict(net_arch=list(args.hidden), activation_fn=torch.nn.ReLU, n_critics=2,
                                   optimizer_class=torch.optim.Adam, optimizer_kwargs=dict(eps=1e-8)))
    cpu, wall = time.process_time(), time.perf_counter()
    model.learn(total_timesteps=args.steps)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    ret = evaluate(lambda obs: model.predict(obs, deterministic=True)[0], args.seed)
    return {"cpu_s": cpu, "wall_s": wall, "updates": int(model._n_updates), "return": ret}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--learning-starts", type=int, default=1000)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--side", choices=["ours", "sb3"], help=argparse.SUPPRESS)  # one run, in a subprocess
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.side:
        print(json.dumps((run_ours if args.side == "ours" else run_sb3)(args)))
        return
    if args.quick:
        args.steps, args.learning_starts, args.seeds, args.hidden = 600, 200, 1, [64, 64]
    load_start = os.getloadavg()
    print(f"machine: {os.cpu_count()} CPUs, load average at start {load_start}; torch {torch.__version__}, "
          f"1 thread per run")
    print(f"settings: {ENV}, {args.steps} env steps, learning_starts {args.learning_starts}, nets {args.hidden}, "
          f"batch 256, lr 3e-4, tau 0.005, gamma 0.99, utd 1, auto temperature (init 1.0), seeds {args.seeds}")
    runs: dict[str, list[dict]] = {"ours": [], "sb3": []}
    for seed in range(args.seeds):
        for side in (("ours", "sb3") if seed % 2 == 0 else ("sb3", "ours")):  # alternate who goes first
            cmd = [sys.executable, __file__, "--side", side, "--seed", str(seed), "--steps", str(args.steps),
                   "--learning-starts", str(args.learning_starts), "--hidden", *map(str, args.hidden)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            runs[side].append(json.loads(out))
            r = runs[side][-1]
            print(f"seed {seed} {side:4s}: cpu {r['cpu_s']:.1f} s, wall {r['wall_s']:.1f} s, {r['updates']} updates, "
                  f"return {r['return']:.1f}, load {os.getloadavg()[0]:.2f}", flush=True)
    med = {s: {k: statistics.median(r[k] for r in runs[s]) for k in ("cpu_s", "wall_s", "return")} for s in runs}
    print(f"median: ours cpu {med['ours']['cpu_s']:.1f} s / wall {med['ours']['wall_s']:.1f} s, return "
          f"{med['ours']['return']:.1f}; sb3 cpu {med['sb3']['cpu_s']:.1f} s / wall {med['sb3']['wall_s']:.1f} s, "
          f"return {med['sb3']['return']:.1f}; wall ratio {med['ours']['wall_s'] / med['sb3']['wall_s']:.3f}")
    print(f"machine: load average at end {os.getloadavg()}")
    print(json.dumps({"bench": "sac_vs_sb3", "time_ratio": round(med["ours"]["cpu_s"] / med["sb3"]["cpu_s"], 3),
                      "return_ours": round(med["ours"]["return"], 1), "return_sb3": round(med["sb3"]["return"], 1)}))


if __name__ == "__main__":
    main()
