"""A GRPO step through the Tinker protocol against the same step in our runner: tinker-cookbook's `math_rl` against
this project's Tinker-compatible server, and `main_grpo.py` on the same task and batch.

Both sides train SmolLM2-135M-Instruct at fp32 with LoRA rank 16 and lr 2e-4, 8 groups of 4 samples a step, on
sums of two numbers up to 100, answers of at most 10 tokens, in process on the 2 cores. The cookbook side is the
recipe unmodified (`scripts/install_tinker_cookbook.sh`): the server (`python -m rlinf_like.tinker serve`) in one
process, the recipe's loop in another, `importance_sampling` (the server refuses the recipe's default
`stable_reinforce`), its renderer `qwen3_instruct` (SmolLM2's ChatML). Ours is the main job's preset with the
overrides below, in process (`cluster.backend=local`, actor and rollout on one slot). The two prompts differ as
each side writes them: the cookbook's carries a few-shot turn (~39 tokens), ours the preset's template (~36).

Each side is a fresh set of processes per repetition, the sides alternated (cookbook first on even repetitions). A
repetition runs `--steps` steps; the first is a warm-up, and its step time is the median of the others: the
recipe's `time/total`, and our runner's `step_s`. Last line: one JSON object, `step_ratio` = median(cookbook) /
median(ours) over the repetitions (issue 53's target: <= 1.3), with the per-repetition ratios.

    python bench/tinker_vs_grpo.py [--reps 3] [--steps 6]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import Machine, alternating, median_ratio, result_line  # noqa: E402
from rlinf_like.envs.text.openenv_env import free_port  # noqa: E402

MODEL = ROOT / "models" / "smollm2-135m-instruct"
RECIPE = ["env=arithmetic", "loss_fn=importance_sampling", "group_size=4", "groups_per_batch=8", "lora_rank=16",
          "learning_rate=2e-4", "max_tokens=10", "eval_every=0", "save_every=0", "renderer_name=qwen3_instruct"]
OURS = ["actor.lora.rank=16", "actor.precision=fp32", "data.terms=2", "data.max_operand=100", "data.operators=+",
        "runner.prompts_per_step=8", "algorithm.samples_per_prompt=4", "runner.max_new_tokens=10",
        "runner.sft_steps=0", "runner.eval_every=1000", "runner.save_every=1000", "cluster.backend=local",
        "cluster.component_placement.actor=0", "cluster.component_placement.rollout=0"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TINKER_API_KEY": "tml-local"}


def run_cookbook(out: Path, steps: int, server_root: Path) -> list[float]:
    """The recipe's per-step `time/total` against a server started for this repetition alone."""
    port, out = free_port(), out.resolve()
    out.mkdir(parents=True)
    with open(out / "server.log", "w") as log:
        server = subprocess.Popen([sys.executable, "-m", "rlinf_like.tinker", "serve", "--model", str(MODEL),
                                   "--port", str(port), "--out", str(out / "weights")],
                                  cwd=server_root, env=ENV, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(120):
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    raise RuntimeError(f"the server exited: {(out / 'server.log').read_text()[-2000:]}")
                time.sleep(0.5)
        done = subprocess.run([sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train", f"model_name={MODEL}",
                               f"base_url={url}", *RECIPE, f"max_steps={steps}", f"log_path={out / 'recipe'}"],
                              cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=3600)
        if done.returncode:
            raise RuntimeError(f"the recipe failed ({done.returncode}):\n{done.stderr[-3000:]}")
    finally:
        server.terminate()
        server.wait(timeout=60)
    rows = [json.loads(line) for line in (out / "recipe" / "metrics.jsonl").read_text().splitlines()]
    return [r["time/total"] for r in rows if "time/total" in r]


def run_ours(out: Path, steps: int) -> list[float]:
    done = subprocess.run([sys.executable, str(ROOT / "examples/reasoning/main_grpo.py"), f"model.path={MODEL}",
                           *OURS, f"runner.max_steps={steps}", f"runner.output_dir={out}"],
                          cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=3600)
    if done.returncode:
        raise RuntimeError(f"ours failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return [h["step_s"] for h in json.loads((out / "checkpoint" / "runner.json").read_text())["history"][1:]]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--server-root", type=Path, default=ROOT,
                   help="the checkout whose server the recipe talks to (another commit's, to compare two servers)")
    args = p.parse_args()
    if not MODEL.is_dir():
        sys.exit(f"{MODEL} is missing: bash scripts/setup.sh writes it")
    try:
        import tinker_cookbook  # noqa: F401
    except ModuleNotFoundError:
        sys.exit("tinker-cookbook is not installed: bash scripts/install_tinker_cookbook.sh")
    machine = Machine.start({"reps": args.reps, "steps": args.steps, "recipe": RECIPE, "ours": OURS,
                             "server_root": str(args.server_root), "precision": "fp32 both"})
    scratch = Path(tempfile.mkdtemp(prefix="tinker-vs-grpo-"))

    def measure(side):
        def one(rep: int) -> float:
            out = scratch / f"{side}{rep}"
            try:
                steps = (run_cookbook(out, args.steps, args.server_root) if side == "cookbook"
                         else run_ours(out, args.steps))
            finally:  # each side's checkpoints and exports take GBs
                shutil.rmtree(out, ignore_errors=True)
            print(f"rep {rep} {side}: steps {[round(s, 1) for s in steps]} s", flush=True)
            return statistics.median(steps[1:] if len(steps) > 1 else steps)
        return one

    steps = alternating({"cookbook": measure("cookbook"), "ours": measure("ours")}, args.reps)
    machine.end()
    print(result_line("tinker_vs_grpo", step_ratio=median_ratio(steps["cookbook"], steps["ours"]),
                      per_rep_ratios=[c / o for c, o in zip(steps["cookbook"], steps["ours"])],
                      cookbook_step_s=steps["cookbook"], ours_step_s=steps["ours"], reps=args.reps))


if __name__ == "__main__":
    main()
