"""IFEval learning against TRL 1.16: how far TRL's GRPOTrainer gets in the preset's steps, on the same held-out test.

TRL runs issue 50's recipe for `--steps` steps with the settings of `bench/lora_step_vs_trl.py --recipe ifeval` (the
same pool of generated prompts, taken in the pool's order where ours draws by its seed; the same chat template,
reward function, LoRA, optimizer, groups and answer cap; bf16 where the CPU has bf16 units) and keeps its adapter
every `--save-every` steps. Then one evaluator scores every model on the preset's held-out set (the first 100
official prompts whose every instruction is a trained type), greedy, at the preset's 256-token cap: the base model,
each TRL adapter merged into it, and each of our runs' `final_model/` given with `--ours`. One evaluator for all, so
the batching and precision that move a single score by a few points are the same on both sides; our runs' own
curves (evaluated inside the run) are in docs/benchmarks/reasoning.md.

    python bench/ifeval_curve_vs_trl.py [--steps 24] [--save-every 8] [--seed 0] [--ours runs/grpo_ifeval_smollm2/final_model]
    python bench/ifeval_curve_vs_trl.py --steps 14 --save-every 2 --eval-steps 8,10,12,14   # where TRL crosses a score
    python bench/ifeval_curve_vs_trl.py --quick   # the tiny random model: 2 steps, 4 held-out prompts, 16 tokens

Last line: one JSON object with each model's held-out prompt-level loose score, the gains over the base model of
TRL's last adapter and of the first `--ours` model, and TRL's seconds a step.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import Machine, result_line  # noqa: E402
from bench.lora_step_vs_trl import RECIPES, bf16_host, compose, require_trl, timed  # noqa: E402

STEP_BENCH = ROOT / "bench" / "lora_step_vs_trl.py"


def held_out(cfg, limit: int | None) -> list[dict]:
    """The preset's held-out prompts as the official rows the checkers read; with `limit`, the shortest `limit`
    (the tiny model's context is 256 tokens)."""
    from rlinf_like.data.sources import load_tasks

    rows = [{"key": i, "prompt": p.prompt, **p.fields} for i, p in enumerate(load_tasks(cfg.data).test)]
    return sorted(rows, key=lambda r: len(r["prompt"]))[:limit] if limit else rows


def merged(base: str, adapter: Path, dest: Path) -> Path:
    """`adapter` (peft) merged into `base`, saved as a model folder with the base's tokenizer and chat template."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().save_pretrained(dest)
    AutoTokenizer.from_pretrained(base).save_pretrained(dest)
    return dest


def evaluate(model: str, rows: list[dict], max_new_tokens: int) -> dict:
    from rlinf_like.eval.ifeval import generate, score

    start = time.monotonic()
    report = score(rows, generate(model, rows, max_new_tokens, progress=False))
    return {**{k: round(v, 4) for k, v in report.scores.items()}, "eval_s": round(time.monotonic() - start, 1)}


def run_trl(args, out: Path, bf16: bool) -> tuple[int, float, dict]:
    """TRL's learning run in its own process: (exit status, wall seconds, its timing.json). A run the kernel kills
    (out of memory, as on a 24 GB host) keeps the steps and adapters it made, which are then evaluated."""
    cmd = [sys.executable, str(STEP_BENCH), "--side", "trl", "--recipe", "ifeval", "--out", str(out),
           "--steps", str(args.steps), "--seed", str(args.seed), "--threads", str(args.threads),
           "--save-every", str(args.save_every), *(["--bf16"] if bf16 else []), "--", *args.overrides]
    start = time.monotonic()
    rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": str(args.threads)}).returncode
    wall = time.monotonic() - start
    timing = json.loads((out / "timing.json").read_text()) if (out / "timing.json").exists() else {}
    timing.setdefault("step_s", []), timing.setdefault("reward", []), timing.setdefault("peak_rss_gb", None)
    status = "finished" if rc == 0 else f"ENDED WITH rc {rc} after {len(timing['step_s'])} steps"
    print(f"TRL {status}: {wall:.0f} s wall, step s {[round(x, 1) for x in timing['step_s']]}, train reward "
          f"{[round(r, 3) for r in timing['reward']]}, peak RSS {timing['peak_rss_gb']} GB", flush=True)
    return rc, wall, timing


def print_table(scores: dict[str, dict], prompts: int, new_tokens: int) -> None:
    print(f"held-out: {prompts} prompts, greedy, {new_tokens} new tokens")
    print(f"{'model':<16} {'prompt loose':>12} {'prompt strict':>13} {'inst strict':>11} {'inst loose':>10}")
    for name, s in scores.items():
        print(f"{name:<16} {s['prompt_loose']:>12.3f} {s['prompt_strict']:>13.3f} {s['inst_strict']:>11.3f} "
              f"{s['inst_loose']:>10.3f}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--save-every", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="TRL's torch threads")
    p.add_argument("--eval-steps", default=None,
                   help="comma list: evaluate only TRL's adapters of these steps (default: every one kept)")
    p.add_argument("--ours", action="append", default=[], help="one of our runs' final_model/ (repeatable)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("overrides", nargs="*", help="more overrides of the preset, for TRL and the held-out set")
    args = p.parse_args()
    require_trl()
    limit, new_tokens = None, None
    if args.quick:
        from rlinf_like.models.tiny import write_tiny_model

        tiny = write_tiny_model(Path(tempfile.mkdtemp(prefix="tiny-")))
        args.steps, args.save_every, limit = 2, 1, 4
        args.overrides = [f"model.path={tiny}", "runner.max_new_tokens=16", "rollout.max_context=1024",
                          *args.overrides]
    preset = RECIPES["ifeval"][0][:2] + args.overrides
    cfg = compose(preset)
    base, new_tokens = cfg.model.path, cfg.runner.max_new_tokens
    bf16 = bf16_host()
    machine = Machine.start({"steps": args.steps, "save_every": args.save_every, "eval_steps": args.eval_steps,
                             "seed": args.seed,
                             "trl_threads": args.threads, "trl_precision": "bf16" if bf16 else "fp32",
                             "preset": preset, "eval_new_tokens": new_tokens,
                             "ours": args.ours})
    out = Path(tempfile.mkdtemp(prefix="ifeval-trl-"))
    rc, trl_wall, timing = run_trl(args, out, bf16)
    rows = held_out(cfg, limit)
    scores = {"base": evaluate(base, rows, new_tokens)}
    saved = sorted(int(d.name.split("-")[1]) for d in (out / "trainer").glob("checkpoint-*"))
    if args.eval_steps:
        saved = [s for s in saved if s in {int(x) for x in args.eval_steps.split(",")}]
    for step in saved:
        model = merged(base, out / "trainer" / f"checkpoint-{step}", out / f"merged-{step}")
        scores[f"trl_step_{step}"] = evaluate(str(model), rows, new_tokens)
    for i, model in enumerate(args.ours):
        scores[f"ours_{i}"] = evaluate(model, rows, new_tokens)
    machine.end()
    print_table(scores, len(rows), new_tokens)
    loose = {k: s["prompt_loose"] for k, s in scores.items()}
    gains = {"trl_gain": loose[f"trl_step_{saved[-1]}"] - loose["base"]} if saved else {}
    if args.ours:
        gains["ours_gain"] = loose["ours_0"] - loose["base"]
    print(result_line("ifeval_curve_vs_trl", **gains, trl_step_s=timed(timing)[0] if timing["step_s"] else None,
                      trl_wall_s=trl_wall, trl_steps=len(timing["step_s"]), trl_rc=rc,
                      trl_peak_rss_gb=timing["peak_rss_gb"], held_out=loose, quick=args.quick))


if __name__ == "__main__":
    main()
