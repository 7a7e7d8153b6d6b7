"""Env steps/s of the embodied runner with pipeline stages versus the sequential loop.

Same workers, env, policy and seeds; only `runner.pipeline` differs. The mix is chosen so both
sides cost something: reach_colour from 96x96 offscreen-rendered pixels (MuJoCo, OSMesa/EGL) with
the VLA policy at width 128 (inference on 4 images is about half a 4-env step here). Each
repetition is one run of the hydra example (its own Ray instance, a few PPO updates with one
cheap epoch); the runner logs env steps/s of every update's collection phase, the first update
(warm-up) is dropped and the rest give that run's median. Runs alternate A B B A ... so drift in
the machine's load hits both sides alike; the speedup is the ratio of the two medians.
Last line: one JSON object, speedup = pipelined / sequential env steps/s (target >= 1.3).

    python bench/embodied_pipeline.py [--reps 3] [--updates 5] [--env libero] [--quick]

`--env libero`: the same comparison on LIBERO (2 envs of libero_spatial task 0, two 128x128 cameras), where the
simulator dominates (a step ~0.3-0.5 s on CPU against milliseconds of inference), so the overlap can gain little;
it shows pipeline mode running with that env.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "examples" / "embodied" / "main_embodied.py"
MIXES = {  # env -> (overrides, env steps per update)
    "reach_colour": (["env=reach_colour_pixels", "policy=vla", "env.image_size=96", "policy.width=128",
                      "env.num_envs=8", "runner.steps_per_rollout=32", "algorithm.ppo.epochs=1",
                      "algorithm.ppo.mini_batches=2",
                      "runner.save_every=1000"], 8 * 32),
    # LIBERO (the [libero] extra): 2 envs of task 0 (one per stage), two 128x128 cameras, the VLA for LIBERO
    "libero": (["env=libero_spatial", "policy=vla_libero", "env.num_envs=2", "+env.kwargs.task_ids=[0]",
                "runner.steps_per_rollout=8", "algorithm.ppo.epochs=1", "algorithm.ppo.mini_batches=2",
                "runner.save_every=1000"], 2 * 8),
}


# --quick: a smoke run (4 envs x 16 steps an update, one run per side); its speedup is not a measurement
QUICK = (["env.num_envs=4", "runner.steps_per_rollout=16"], 4 * 16)


def one_run(pipeline: bool, updates: int, out: Path, env_name: str = "reach_colour", quick: bool = False) -> float:
    mix, per_update = MIXES[env_name]
    if quick and env_name == "reach_colour":
        mix, per_update = [*mix, *QUICK[0]], QUICK[1]  # the later value of a key wins in hydra
    cmd = [sys.executable, str(MAIN), *mix, f"runner.total_env_steps={updates * per_update}",
           f"runner.pipeline={str(pipeline).lower()}", f"runner.output_dir={out}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    history = json.loads((out / "checkpoint" / "runner.json").read_text())["history"]
    rates = [h["env_steps_per_s"] for h in history[1:]]
    busy = [(h["env_busy_s"], h["rollout_busy_s"], h["collect_s"]) for h in history[1:]]
    env_b, roll_b, col = (statistics.median(x) for x in zip(*busy))
    print(f"{'pipeline' if pipeline else 'sequential':>10}: {statistics.median(rates):7.1f} env steps/s "
          f"(per update: {', '.join(f'{r:.0f}' for r in rates)}; median env busy {env_b:.2f} s, "
          f"rollout busy {roll_b:.2f} s, collect {col:.2f} s)", flush=True)
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3, help="runs per side")
    parser.add_argument("--updates", type=int, default=5, help="PPO updates per run (the first is dropped)")
    parser.add_argument("--env", choices=sorted(MIXES), default="reach_colour", help="the env mix (libero: LIBERO)")
    parser.add_argument("--quick", action="store_true", help="one run per side, 2 updates of 4 envs x 16 steps")
    args = parser.parse_args()
    if args.quick:
        args.reps, args.updates = 1, 2
    order = [i % 4 in (1, 2) for i in range(2 * args.reps)]  # False True True False ...: A B B A
    results: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i, pipeline in enumerate(order):
            results[pipeline].append(one_run(pipeline, args.updates, Path(tmp) / f"run{i}", args.env, args.quick))
    seq, pipe = statistics.median(results[False]), statistics.median(results[True])
    print(f"median env steps/s: sequential {seq:.1f}, pipeline {pipe:.1f}; speedup {pipe / seq:.3f}")
    print(json.dumps({"bench": "embodied_pipeline", "env": args.env, "speedup": round(pipe / seq, 3),
                      "sequential_steps_per_s": round(seq, 1), "pipeline_steps_per_s": round(pipe, 1),
                      "runs": {"sequential": [round(r, 1) for r in results[False]],
                               "pipeline": [round(r, 1) for r in results[True]]}}))


if __name__ == "__main__":
    main()
