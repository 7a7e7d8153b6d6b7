"""Steps/s of env.kind=libero (our `LiberoEnv`) against the library driven directly.

Both sides step task 0 of libero_spatial with two 128x128 cameras (agentview + eye-in-hand) and the same
seeded random actions. The baseline is the loop a LIBERO user writes: `OffScreenRenderEnv.step` then
`check_success` (LIBERO's own evaluation loop), built with the settings our adapter uses (hard_reset=False,
ignore_done, no horizon), so the ratio is the adapter's own cost (upright image copies, instruction tokens,
proprio, action checks, episode bookkeeping). One env per side, built once before timing; repetitions
alternate A B B A ...; steps/s of each side is the median over its repetitions.
Last line: one JSON object, ratio = ours / library steps/s (target >= 0.95).

    python bench/libero_env.py [--reps 3] [--steps 30] [--quick]
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

from bench.common import Machine, median_ratio, result_line  # noqa: E402
from rlinf_like.envs.libero import LiberoEnv  # noqa: E402

SIZE, SUITE, TASK = 128, "libero_spatial", 0


def library_env(suite):
    from libero.libero import get_libero_path
    from libero.libero.envs import OffScreenRenderEnv

    task = suite.get_task(TASK)
    bddl = Path(get_libero_path("bddl_files")) / task.problem_folder / task.bddl_file
    env = OffScreenRenderEnv(bddl_file_name=str(bddl), camera_heights=SIZE, camera_widths=SIZE, ignore_done=True,
                             horizon=10 ** 9, hard_reset=False)
    env.reset()
    env.set_init_state(suite.get_task_init_states(TASK)[0])
    return env


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3, help="repetitions per side")
    parser.add_argument("--steps", type=int, default=30, help="env steps per repetition")
    parser.add_argument("--quick", action="store_true", help="2 reps of 8 steps")
    args = parser.parse_args()
    reps, steps = (2, 8) if args.quick else (args.reps, args.steps)
    machine = Machine.start({"suite": SUITE, "task": TASK, "cameras": 2, "image_size": SIZE, "reps": reps,
                             "steps": steps, "order": "A B B A ...", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "auto")})
    t0 = time.perf_counter()
    ours = LiberoEnv(1, "bench", SUITE, SIZE, 10 ** 6, task_ids=[TASK])  # ensure_gl() runs before mujoco loads
    ours.reset(seed=0)
    theirs = library_env(ours.suite)
    print(f"built both envs in {time.perf_counter() - t0:.1f} s", flush=True)
    actions = np.random.default_rng(0).uniform(-1, 1, (steps, 7))
    rates: dict[str, list[float]] = {"ours": [], "library": []}
    for i in range(2 * reps):
        side = "library" if i % 4 in (1, 2) else "ours"
        start = time.perf_counter()
        for a in actions:
            if side == "ours":
                ours.step(a[None])
            else:
                theirs.step(a)
                theirs.check_success()
        rates[side].append(steps / (time.perf_counter() - start))
        print(f"rep {i // 2 + 1} {side:>7}: {rates[side][-1]:.2f} steps/s", flush=True)
    ours.close()
    theirs.close()
    machine.end()
    ratio = median_ratio(rates["ours"], rates["library"])
    print(f"median steps/s: ours {statistics.median(rates['ours']):.2f}, library "
          f"{statistics.median(rates['library']):.2f}; ratio {ratio:.3f}")
    print(result_line("libero_env", ratio=ratio, steps_per_s=statistics.median(rates["ours"]),
                      library_steps_per_s=statistics.median(rates["library"])))


if __name__ == "__main__":
    main()
