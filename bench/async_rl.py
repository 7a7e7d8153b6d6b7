"""Asynchronous vs synchronous GRPO on the main job: wall time to the same held-out accuracy, on 2 cores.

    python bench/async_rl.py                          # 2 seeds, 150 steps, staleness 1 (and the sweep below)
    python bench/async_rl.py --staleness 1 2 4        # time_ratio for each runner.max_staleness
    python bench/async_rl.py --quick                  # a few steps, one seed: checks the script runs

Sync: the main job's preset as shipped (`grpo_collocated`: actor and rollout share both CPU slots and take
turns). Async: the same preset (model, data, SFT warm start, algorithm, seed) with the actor on slot 0, the
rollout on slot 1 and `runner.schedule=async` (`stale_policy=wait`). Per seed the sides alternate (sync first
for even seeds, async first for odd ones). Clock: the run's RL seconds (`elapsed_s`: no SFT, evaluations or
checkpoints). Target: the median final held-out accuracy of the sync runs, less 2 points; time to target is the
clock at the first evaluation that reaches it (a run that never does counts as its whole clock, and is
flagged). Last line: {"bench": "async_rl", "time_ratio": async / sync time to target (medians),
"accuracy_async": ..., "accuracy_sync": ... (median final accuracies), "time_ratio_by_staleness": {k: ...}}.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.core.config_store import ConfigStore  # noqa: E402

from rlinf_like.config import hydra_schema, structure  # noqa: E402
from rlinf_like.runners.reasoning.config import ReasoningConfig  # noqa: E402
from rlinf_like.runners.reasoning import train  # noqa: E402
from rlinf_like.utils.threads import limit_threads  # noqa: E402

ASYNC = ["runner.schedule=async", "cluster.component_placement.actor=0", "cluster.component_placement.rollout=1",
         "cluster.component_placement.reward=1"]  # the reward with the rollout: its slot has room, the actor's has none


def run(overrides: list[str], out: Path) -> list[dict]:
    with initialize_config_dir(str(ROOT / "examples" / "reasoning" / "config"), version_base="1.3"):
        cfg = structure(ReasoningConfig, compose("grpo_collocated", [*overrides, f"runner.output_dir={out}"]))
    return train(cfg).history


def time_to(history: list[dict], target: float) -> tuple[float, bool]:
    """The RL clock at the first evaluation reaching `target`, and whether one did."""
    for h in history:
        if h.get("eval_accuracy", -1) >= target and "elapsed_s" in h:
            return h["elapsed_s"], True
    return history[-1]["elapsed_s"], False


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=150)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--staleness", type=int, nargs="+", default=[1])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    limit_threads()
    common = [f"runner.max_steps={args.max_steps}", f"runner.eval_every={args.eval_every}", "runner.save_every=10000"]
    if args.quick:
        args.seeds, args.staleness = 1, args.staleness[:1]
        common = ["runner.max_steps=2", "runner.eval_every=2", "runner.save_every=10000", "runner.sft_steps=5",
                  "runner.prompts_per_step=8", "data.test_problems=40"]
    ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))
    print(f"machine: {platform.node()} {os.cpu_count()} CPUs, load {os.getloadavg()}; preset grpo_collocated; "
          f"common overrides {common}; async adds {ASYNC} runner.max_staleness=k (stale_policy wait)", flush=True)
    histories: dict[str, list[list[dict]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            sides = [("sync", [])] + [(f"async_k{k}", [*ASYNC, f"runner.max_staleness={k}"]) for k in args.staleness]
            for name, extra in (sides if seed % 2 == 0 else sides[::-1]):
                history = run([*common, *extra, f"runner.seed={seed}"], Path(tmp) / f"{name}_{seed}")
                histories.setdefault(name, []).append(history)
                final = [h["eval_accuracy"] for h in history if "eval_accuracy" in h][-1]
                print(f"seed {seed} {name}: final accuracy {final:.3f}, RL clock {history[-1]['elapsed_s']:.1f} s, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
    final = {name: statistics.median([[h["eval_accuracy"] for h in hs if "eval_accuracy" in h][-1] for hs in runs])
             for name, runs in histories.items()}
    target = final["sync"] - 0.02
    to_target = {}
    for name, runs in histories.items():
        times = [time_to(h, target) for h in runs]
        to_target[name] = statistics.median(t for t, _ in times)
        missed = sum(not reached for _, reached in times)
        print(f"{name}: time to {target:.3f} per seed {[round(t, 1) for t, _ in times]} s"
              f"{f' ({missed} never reached it: whole clock counted)' if missed else ''}; final accuracy {final[name]:.3f}")
    by_k = {k: round(to_target[f"async_k{k}"] / to_target["sync"], 3) for k in args.staleness}
    print(json.dumps({"bench": "async_rl", "time_ratio": by_k[args.staleness[0]],
                      "accuracy_async": final[f"async_k{args.staleness[0]}"], "accuracy_sync": final["sync"],
                      "time_ratio_by_staleness": by_k}))


if __name__ == "__main__":
    main()
