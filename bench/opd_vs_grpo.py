"""On-policy distillation against GRPO at equal RL seconds, on the `opd_smollm2` preset, seed by seed.

Student: `models/smollm2-8l` (SmolLM2-135M-Instruct's first 8 layers) after the preset's SFT warm start; both
sides start from the same warm-started student (same seed, same SFT). Teacher: SmolLM2-135M-Instruct after
`grpo_smollm2`'s warm start and one GRPO step (made once under --out unless --teacher names one): the model as
shipped answers in prose, not in the task's `\\boxed{}` format. Then OPD for --steps steps, and GRPO on the task
reward, with the same lr and batch, for as many steps as the budget allows; GRPO's accuracy is read at its last
evaluation within OPD's RL seconds. In process (`cluster.backend=local`), one rank per component; the sides
alternate which goes first from seed to seed. Prints per seed the held-out accuracy curves and the per-token
reverse KL to the teacher (`opd/reverse_kl`, means of the first and last quarter of the steps); the last line is
one JSON object.

    python bench/opd_vs_grpo.py --seeds 0 1 --steps 20
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import Machine, result_line  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "examples/reasoning/config"
IN_PROCESS = {"actor": "0", "rollout": "0", "reward": "0"}


def config(preset: str, overrides: list[str], out: Path, placement: dict):
    from hydra.core.config_store import ConfigStore

    from rlinf_like.config import hydra_schema
    from rlinf_like.config.cli import composed
    from rlinf_like.runners.reasoning.config import ReasoningConfig

    ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))
    cfg = composed(ReasoningConfig, CONFIG, preset, overrides)
    cfg.cluster.backend, cfg.cluster.component_placement = "local", placement
    cfg.runner.output_dir = str(out)
    return cfg


def make_teacher(out: Path) -> Path:
    """grpo_smollm2's warm start and one GRPO step: its final_model/ answers in the task's format."""
    from rlinf_like.runners.reasoning import train

    final = out / "final_model"
    if not (final / "config.json").exists():
        train(config("grpo_smollm2", ["runner.max_steps=1", "runner.save_every=1000"], out, IN_PROCESS))
        shutil.rmtree(out / "checkpoint", ignore_errors=True)
    return final


def run(side: str, seed: int, steps: int, args, teacher: Path, out: Path) -> list[dict]:
    from rlinf_like.runners.reasoning import train

    overrides = [f"runner.seed={seed}", f"runner.max_steps={steps}", f"runner.eval_every={args.eval_every}",
                 "runner.save_every=100000", f"data.test_problems={args.test_problems}",
                 f"runner.prompts_per_step={args.prompts}"] + ([f"algorithm.lr={args.lr}"] if args.lr else [])
    placement = dict(IN_PROCESS)
    if side == "opd":
        overrides.append(f"teacher.model_path={teacher}")
        placement["teacher"] = "0"
    else:
        overrides += ["algorithm.advantage=grpo", "teacher.model_path="]
    history = train(config("opd_smollm2", overrides, out, placement)).history
    shutil.rmtree(out, ignore_errors=True)  # checkpoints and final model: ~1 GB a run
    return history


def evals(history: list[dict]) -> list[tuple[int, float, float]]:
    """(step, RL seconds, held-out accuracy) of each evaluation."""
    return [(h["step"], h.get("elapsed_s", 0.0), h["eval_accuracy"]) for h in history if "eval_accuracy" in h]


def quarter_means(values: list[float]) -> tuple[float, float]:
    q = max(1, len(values) // 4)
    return statistics.mean(values[:q]), statistics.mean(values[-q:])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--steps", type=int, default=20, help="OPD steps")
    p.add_argument("--grpo-steps", type=int, default=0, help="GRPO steps run (0: 1.6 x --steps, read at OPD's time)")
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--test-problems", type=int, default=100)
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (4 samples each)")
    p.add_argument("--lr", type=float, default=0.0, help="both sides' RL learning rate (0: the preset's)")
    p.add_argument("--teacher", default="", help="a teacher final_model/ (default: made under --out)")
    p.add_argument("--out", default="runs/opd_vs_grpo")
    args = p.parse_args()
    out = Path(args.out)
    machine = Machine.start(vars(args))
    teacher = Path(args.teacher) if args.teacher else make_teacher(out / "teacher")
    rows = []
    for i, seed in enumerate(args.seeds):
        sides = ("opd", "grpo") if i % 2 == 0 else ("grpo", "opd")
        got = {side: run(side, seed, args.steps if side == "opd" else args.grpo_steps or int(1.6 * args.steps),
                         args, teacher, out / f"{side}_{seed}") for side in sides}
        opd, grpo = evals(got["opd"]), evals(got["grpo"])
        budget = opd[-1][1]
        grpo_at = [e for e in grpo if e[1] <= budget][-1]
        kl_first, kl_last = quarter_means([h["opd/reverse_kl"] for h in got["opd"] if "opd/reverse_kl" in h])
        rows.append(dict(seed=seed, opd_start=opd[0][2], opd_end=opd[-1][2], opd_seconds=budget,
                         grpo_end=grpo_at[2], grpo_steps=grpo_at[0], grpo_seconds=grpo_at[1],
                         kl_first=kl_first, kl_last=kl_last))
        print(f"seed {seed}: OPD {' '.join(f'{a:.2f}@{s}' for s, _, a in opd)} ({budget:.0f} s); GRPO "
              f"{' '.join(f'{a:.2f}@{s}' for s, _, a in grpo)} (read at step {grpo_at[0]}, {grpo_at[1]:.0f} s); "
              f"reverse KL {kl_first:.2f} -> {kl_last:.2f}", flush=True)
    machine.end()
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    print(result_line("opd_vs_grpo", seeds=args.seeds, opd_end_median=med("opd_end"), grpo_end_median=med("grpo_end"),
                      start_median=med("opd_start"),
                      opd_above_grpo=sum(r["opd_end"] > r["grpo_end"] for r in rows),
                      opd_rose=sum(r["opd_end"] > r["opd_start"] for r in rows),
                      reverse_kl_fell=sum(r["kl_last"] < r["kl_first"] for r in rows),
                      kl_first_median=med("kl_first"), kl_last_median=med("kl_last")))


if __name__ == "__main__":
    main()
