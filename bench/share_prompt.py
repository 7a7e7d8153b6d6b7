"""The main job's step with each prompt computed once per group in training, against each sample's own row.

README's main job (examples/reasoning/main_grpo.py, the default preset) on a real model with only `model.path`
changed, no SFT warm start and no evaluation, for `--steps` GRPO steps, once with `actor.loop.share_prompt=true`
and once with `false` (the row layout every peer trains with), alternating sides over `--reps` repetitions, each
in a fresh process (no cache or warm state crosses runs). Each run's training and rollout seconds per step come
from its own history; the ratios are of medians over every step of every repetition. Each side's MFU is its
closing line's. Last line: one JSON object.

    python bench/share_prompt.py [--model models/smollm2-135m-instruct] [--reps 3] [--steps 2] [--quick]
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
sys.path.insert(0, str(ROOT))

from bench.common import Machine, alternating, result_line  # noqa: E402

MAIN = ROOT / "examples" / "reasoning" / "main_grpo.py"


def run(model: str, share: str, steps: int, out: Path, extra: list[str]) -> dict:
    argv = [sys.executable, str(MAIN), f"model.path={model}" if model else "model.path=", "runner.sft_steps=0", f"runner.max_steps={steps}",
            "runner.eval_every=1000", "runner.save_every=1000", f"actor.loop.share_prompt={share}",
            f"runner.output_dir={out}", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"share_prompt={share} failed:\n{done.stderr[-3000:]}")
    history = json.loads((out / "checkpoint" / "runner.json").read_text())["history"][1:]
    mfu = next((line for line in done.stdout.splitlines() if line.startswith("model FLOP/s")), "")
    return {"train_s": [h["train_s"] for h in history], "rollout_s": [h["rollout_s"] for h in history],
            "loss": [h["loss"] for h in history], "mfu_line": mfu}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="the preset's own tiny model, 1 step, 2 repetitions")
    args = parser.parse_args()
    extra: list[str] = []
    if args.quick:
        args.model, args.reps, args.steps = "", 2, 1
        extra = ["runner.prompts_per_step=4", "runner.max_new_tokens=8"]
    model = str((ROOT / args.model).resolve()) if args.model else ""  # empty: the preset's tiny model
    machine = Machine.start({"model": args.model, "reps": args.reps, "steps": args.steps, "preset": "grpo_collocated",
                             "overrides": ["runner.sft_steps=0", "actor.loop.share_prompt=true|false", *extra],
                             "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"] if "OMP_NUM_THREADS" in os.environ
                             else "1 (each run's)"})
    runs: dict[str, list[dict]] = {"shared": [], "rows": []}
    with tempfile.TemporaryDirectory() as scratch:
        def side(share: str, name: str):
            def measure(rep: int) -> float:
                got = run(model, share, args.steps, Path(scratch) / f"{name}{rep}", extra)
                runs[name].append(got)
                return statistics.median(got["train_s"])
            return measure

        alternating({"shared": side("true", "shared"), "rows": side("false", "rows")}, args.reps,
                     show=lambda rep, v: print(f"rep {rep}: train s/step shared {v['shared']:.2f}, rows "
                                               f"{v['rows']:.2f}", flush=True))
    machine.end()
    med = {name: {key: statistics.median(x for r in rs for x in r[key]) for key in ("train_s", "rollout_s")}
           for name, rs in runs.items()}
    for name, rs in runs.items():
        print(f"{name}: train s/step {[round(x, 2) for r in rs for x in r['train_s']]}, rollout s/step "
              f"{[round(x, 2) for r in rs for x in r['rollout_s']]}; {rs[-1]['mfu_line']}")
    step = {name: med[name]["train_s"] + med[name]["rollout_s"] for name in med}
    print(result_line("share_prompt", train_ratio=med["shared"]["train_s"] / med["rows"]["train_s"],
                      step_ratio=step["shared"] / step["rows"], shared_train_s=med["shared"]["train_s"],
                      rows_train_s=med["rows"]["train_s"], shared_step_s=step["shared"], rows_step_s=step["rows"],
                      reps=args.reps, steps=args.steps, model=args.model))


if __name__ == "__main__":
    main()
