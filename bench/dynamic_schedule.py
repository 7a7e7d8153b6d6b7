"""Dynamic vs static collocated schedule, and vs the default collocated runner: GRPO step time, one process.

    python bench/dynamic_schedule.py                       # small, CPU (2 slots), 3 runs per side
    python bench/dynamic_schedule.py --quick               # one short static and dynamic run: checks the script runs
    python bench/dynamic_schedule.py --migrate-at 0.5      # dynamic with request migration
    python bench/dynamic_schedule.py --gpu --placement "0-1" --hidden 512 --layers 8 --prompts 64 --max-new-tokens 256

Three sides, same config and seed. "static" and "dynamic" run `runners/reasoning/schedules/dynamic.py` (so they train
the same weights; see tests/test_dynamic_schedule.py); only the hand-over differs: static gives the actor
the devices once the whole rollout has offloaded, dynamic gives it each replica's devices as soon as
that replica has finished (with `--migrate-at`, also moves the unfinished requests onto fewer replicas
once that share of groups is done, freeing the others). "collocated" is the default runner
(`runner.schedule=collocated`, `runners/reasoning/schedules/collocated.py`) on the same config: what a user gets
without the dynamic schedule. The order of the sides rotates every repetition; the first step of each
run is dropped (warm-up). Step time = rollout + hand-over + training + weight sync (the run's clock).
Last line: {"bench": "dynamic_schedule", "speedup": static / dynamic, "speedup_vs_collocated":
collocated / dynamic, ...}, from the medians of all kept steps of each side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Machine, median_ratio, result_line  # noqa: E402
from rlinf_like.runners.reasoning.config import ReasoningConfig  # noqa: E402
from rlinf_like.runners.reasoning.schedules import collocated, dynamic  # noqa: E402
from rlinf_like.runtime import ClusterConfig  # noqa: E402
from rlinf_like.utils.threads import limit_threads  # noqa: E402


def config(args, out: Path) -> ReasoningConfig:
    cfg = ReasoningConfig()
    cfg.cluster = ClusterConfig(num_cpus=None if args.gpu else 2, collective_timeout_s=300,
                                component_placement={"actor,rollout": args.placement, "reward": args.reward_placement})
    cfg.model.hidden_size, cfg.model.num_layers = args.hidden, args.layers
    cfg.model.intermediate_size = args.hidden * 11 // 4
    cfg.data.sft_problems, cfg.data.test_problems = 64, 8
    r = cfg.runner
    r.max_steps, r.prompts_per_step, r.max_new_tokens = args.steps, args.prompts, args.max_new_tokens
    cfg.actor.loop.micro_batch_size, cfg.actor.loop.mini_batches = 8, args.mini_batches
    r.sft_steps, r.sft_batch_size, r.eval_every, r.save_every = 2, 16, 10_000, 10_000
    r.output_dir, r.migrate_at = str(out), args.migrate_at
    cfg.rollout.max_batch_size = args.slots
    cfg.algorithm.samples_per_prompt = 4
    cfg.actor.loss.entropy_coef = 0.01
    return cfg


def step_times(history: list[dict]) -> list[float]:
    clock = [h["elapsed_s"] for h in history if "elapsed_s" in h]
    return [b - a for a, b in zip(clock, clock[1:])]  # drops step 1 (warm-up)


SIDES = ("collocated", "static", "dynamic")


def run_side(side: str, cfg: ReasoningConfig) -> list[dict]:
    if side == "collocated":
        cfg.runner.schedule = "collocated"
        return collocated.train(cfg).history
    cfg.runner.schedule = "dynamic"  # the config as a dynamic run has it; `handover` picks the hand-over
    return dynamic.train(cfg, handover=side).history


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3, help="runs per side")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=24)
    p.add_argument("--mini-batches", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--placement", default="0-1", help="actor,rollout devices (one replica per device)")
    p.add_argument("--reward-placement", default="0")
    p.add_argument("--migrate-at", type=float, default=0.0, help="dynamic: runner.migrate_at (0 = no migration)")
    p.add_argument("--slots", type=int, default=128, help="rollout.max_batch_size per replica")
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--quick", action="store_true", help="one 2-step run (one step kept) of static and of dynamic, "
                   "8 prompts; the collocated runner, which every reasoning test runs, is left out of this smoke run")
    args = p.parse_args()
    sides = SIDES
    if args.quick:
        args.reps, args.steps, args.prompts, args.max_new_tokens = 1, 2, 8, 16
        sides = ("static", "dynamic")
    limit_threads()
    machine = Machine.start(vars(args))
    times: dict[str, list[float]] = {side: [] for side in sides}
    n = len(sides)
    order = [s for i in range(args.reps) for s in (sides[i % n:] + sides[:i % n])]  # each side first in turn
    with tempfile.TemporaryDirectory() as tmp:
        for i, side in enumerate(order):
            history = run_side(side, config(args, Path(tmp) / f"{side}{i}"))
            times[side] += step_times(history)
            early = sum(h.get("sched_early_minibatches", 0) for h in history)
            moved = sum(h.get("sched_migrated", 0) for h in history)
            print(f"run {i} {side}: step times {[round(t, 3) for t in step_times(history)]}, "
                  f"mini-batches trained before the rollout ended: {early:.0f}, requests migrated: {moved:.0f}",
                  flush=True)
    med = {side: statistics.median(t) for side, t in times.items()}
    print("median step: " + ", ".join(f"{side} {t:.3f} s" for side, t in med.items()))
    machine.end()
    versus = {} if "collocated" not in times else {
        "speedup_vs_collocated": median_ratio(times["collocated"], times["dynamic"]),
        "static_vs_collocated": median_ratio(times["collocated"], times["static"])}
    print(result_line("dynamic_schedule", speedup=median_ratio(times["static"], times["dynamic"]), **versus,
                      step_s={side: round(t, 4) for side, t in med.items()}, reps=args.reps,
                      migrate_at=args.migrate_at, load_start=machine.load_start, load_end=machine.load_end))


if __name__ == "__main__":
    main()
