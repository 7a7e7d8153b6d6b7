"""Record (or check) the golden runs of the reasoning runner: `examples/reasoning/main_grpo.py` with a fixed
seed, 20 SFT steps and 6 GRPO steps, for each schedule and the critic path. Every step's reward, loss and
grad norm, and a digest of each exported tensor, go to `reasoning_runs.json` beside this file, under this
machine's kernel path (`kernel_path()`): MKL and oneDNN pick their kernels by the CPU's vector units and vendor,
and the low bits of a run follow the kernels, so a recording is exact only on the path it was made on.

    .venv/bin/python tests/golden/record.py            # record this machine's path (others are kept)
    .venv/bin/python tests/golden/record.py gae        # record one run anew on this path

tests/test_golden_runs.py re-runs the same commands and compares.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "examples" / "reasoning" / "main_grpo.py"
GOLDEN = Path(__file__).with_name("reasoning_runs.json")
COMMON = ["runner.seed=0", "runner.sft_steps=20", "runner.max_steps=6", "runner.prompts_per_step=8",
          "runner.eval_every=100", "runner.save_every=100", "data.test_problems=16",
          "actor.precision=fp32"]  # fp32: the pinned bits are those of the bit-identical mode
# Two runs on Ray, where the process boundary and several ranks are the subject (the collocated preset's FSDP actor
# and rollout on 2 ranks each; the dynamic hand-over between 2 rollout replicas), and two in process
# (`cluster.backend=local`, one rank a group: the pipelined preset as it is, PPO with its critic), which starts no
# Ray and no worker process (~18 s a run here against ~37 s on Ray). The in-process backend gives Ray's bits
# (tests/test_local_backend.py), so what these two pin is the schedule's and the critic's arithmetic.
IN_PROCESS = "cluster.backend=local"
RUNS = {
    "collocated": ["--config-name", "grpo_collocated"],
    "pipelined": ["--config-name", "grpo_pipelined", IN_PROCESS],
    "dynamic": ["--config-name", "grpo_collocated", "runner.schedule=dynamic", "runner.migrate_at=0.5",
                "rollout.logprobs=rescored"],
    "gae": ["--config-name", "grpo_collocated", "algorithm.advantage=gae", IN_PROCESS,
            "cluster.component_placement.actor=0", "cluster.component_placement.rollout=0",
            "cluster.component_placement.critic=0"],
}
METRICS = ("reward", "loss", "grad_norm")


def kernel_path() -> str:
    """What decides which float kernels a run takes: torch's CPU capability (AVX2, AVX512, ...), the vendor (MKL
    takes other paths on AMD), and the bf16/AMX units oneDNN uses when present."""
    import torch

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    vendor = next((line.split(":")[1].strip() for line in info.splitlines() if line.startswith("vendor_id")), "unknown")
    flags = next((set(line.split(":")[1].split()) for line in info.splitlines() if line.startswith("flags")), set())
    units = [f for f in ("avx512_bf16", "amx_bf16") if f in flags]
    return " ".join([torch.backends.cpu.get_cpu_capability(), vendor, *units])


def run(name: str, out: Path) -> dict:
    """One golden run; its per-step metrics and the exported weights' digests."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    proc = subprocess.run([sys.executable, str(MAIN), *RUNS[name], *COMMON, f"runner.output_dir={out}"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"golden run {name} failed:\n{proc.stderr[-4000:]}")
    history = json.loads((out / "checkpoint" / "runner.json").read_text())["history"]
    steps = [{k: h[k] for k in METRICS if k in h} for h in history if h["step"] > 0]
    return {"steps": steps, "weights": weight_digests(out / "final_model")}


def weight_digests(model_dir: Path) -> dict[str, str]:
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return {k: hashlib.sha256(t.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
            .hexdigest() for k, t in sorted(tensors.items())}


def main() -> None:
    import tempfile

    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {"common": COMMON, "paths": {}}
    if golden["common"] != COMMON:
        raise SystemExit(f"{GOLDEN} was recorded with {golden['common']}; delete it to record all paths anew")
    recording = {"commit": commit, "runs": {}}
    only = sys.argv[1:] or list(RUNS)  # record some runs: their names (the path's other recordings are kept)
    if set(only) - set(RUNS):
        raise SystemExit(f"no such run {sorted(set(only) - set(RUNS))}; runs: {list(RUNS)}")
    if kernel_path() in golden["paths"]:
        recording["runs"] = {k: v for k, v in golden["paths"][kernel_path()]["runs"].items() if k not in only}
    with tempfile.TemporaryDirectory() as tmp:
        for name in only:
            recording["runs"][name] = {**run(name, Path(tmp) / name), "commit": commit}
            print(name, recording["runs"][name]["steps"], flush=True)
    golden["paths"][kernel_path()] = recording
    GOLDEN.write_text(json.dumps(golden, indent=1) + "\n")


if __name__ == "__main__":
    main()
