"""Record (or check) the golden runs of the reasoning runner: `examples/reasoning/main_grpo.py` with a fixed
seed, 20 SFT steps and 6 GRPO steps, for each schedule and the critic path. Every step's reward, loss and
grad norm, and a digest of each exported tensor, go to `reasoning_runs.json` beside this file, under this
machine's kernel path (`kernel_path()`): MKL and oneDNN pick their kernels by the CPU's vector units and vendor,
and the low bits of a run follow the kernels, so a recording is exact only on the path it was made on.

    .venv/bin/python tests/golden/record.py            # record this machine's path (others are kept)
    .venv/bin/python tests/golden/record.py gae        # record one run anew on this path

tests/test_golden_runs.py re-runs the same commands and compares. A run named in `TEST_RUNS` is a test's own
configuration instead of a command line (the dynamic schedule's, in tests/test_dynamic_schedule.py); its test
checks it against `<name>.json` here, and `record.py <name>` runs that test to record it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

from rlinf_like.utils import hardware

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / "examples" / "reasoning" / "main_grpo.py"
GOLDEN = Path(__file__).with_name("reasoning_runs.json")
COMMON = ["runner.seed=0", "runner.sft_steps=20", "runner.max_steps=6", "runner.prompts_per_step=8",
          "runner.eval_every=100", "runner.save_every=100", "data.test_problems=16",
          # fp32: the pinned bits are those of the bit-identical mode; rows one by one, as recorded (a shared
          # prompt, actor.loop.share_prompt, gives the same numbers only up to rounding)
          "actor.precision=fp32", "actor.loop.share_prompt=false"]
# All three in process (`cluster.backend=local`, one rank a group), which starts no Ray and no worker process (~20
# CPU-s a run here against ~55 on Ray, most of that five worker processes importing torch): the collocated preset
# as README's in-process debugging command runs it, the pipelined preset as it is, and PPO with its critic. The
# in-process backend gives Ray's bits (tests/test_local_backend.py), so what these pin is the schedules' and the
# critic's arithmetic. Several ranks on Ray are pinned by the dynamic schedule's run (`TEST_RUNS`): its static and
# dynamic hand-overs train a data-parallel actor of 2 ranks beside 2 rollout replicas, bit for bit alike.
IN_PROCESS = "cluster.backend=local"
ONE_RANK = ["cluster.component_placement.actor=0", "cluster.component_placement.rollout=0"]
RUNS = {
    "collocated": ["--config-name", "grpo_collocated", IN_PROCESS, *ONE_RANK],
    "pipelined": ["--config-name", "grpo_pipelined", IN_PROCESS],
    "gae": ["--config-name", "grpo_collocated", "algorithm.advantage=gae", IN_PROCESS, *ONE_RANK,
            "cluster.component_placement.critic=0"],
}
METRICS = ("reward", "loss", "grad_norm")
# Between the AVX2 (AMD EPYC) and the AVX-512 + bf16 (Zen 4) recordings, over all four runs' 6 steps, the largest
# differences were: reward 0 (every sampled token the same), loss 1.5e-7, grad norm 4.4e-6, and every exported
# tensor differed in its low bits. The tolerance is 10x those for loss and grad norm, and for the reward one sample
# of a step's 64 scored otherwise (a token one ulp from a tie may be sampled differently on a third path). The Intel
# Xeon (AMX) recording is within these of the Zen 4 one: reward 0, loss 3.7e-8, grad norm 2.1e-6 at most.
CROSS_PATH_TOL = {"reward": 1 / 64, "loss": 1.5e-6, "grad_norm": 5e-5}
# runs recorded from a test's own config rather than a command line (tests/test_dynamic_schedule.py): one file each
TEST_RUNS = {"dynamic_schedule": "tests/test_dynamic_schedule.py::test_dynamic_schedule_equals_static_bit_for_bit"}
RECORD_ENV = "RLINF_GOLDEN_RECORD"  # set to a TEST_RUNS name: that test records its run instead of checking it


def kernel_path() -> str:
    """What decides which float kernels a run takes: torch's CPU capability (AVX2, AVX512, ...), the vendor (MKL
    takes other paths on AMD), and the bf16/AMX units oneDNN uses when present."""
    import torch

    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    vendor = next((line.split(":")[1].strip() for line in info.splitlines() if line.startswith("vendor_id")), "unknown")
    units = hardware.cpu_bf16_units()  # none where ONEDNN_MAX_CPU_ISA/ATEN_CPU_CAPABILITY caps the kernels
    return " ".join([torch.backends.cpu.get_cpu_capability(), vendor, *units])


def run(name: str, out: Path) -> dict:
    """One golden run; its per-step metrics and the exported weights' digests."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    proc = subprocess.run([sys.executable, str(MAIN), *RUNS[name], *COMMON, f"runner.output_dir={out}"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"golden run {name} failed:\n{proc.stderr[-4000:]}")
    history = json.loads((out / "checkpoint" / "runner.json").read_text())["history"]
    return {"steps": metric_steps(history), "weights": weight_digests(out / "final_model")}


def metric_steps(history: list[dict]) -> list[dict]:
    """What a recording keeps of a run's history: each GRPO step's METRICS."""
    return [{k: h[k] for k in METRICS if k in h} for h in history if h["step"] > 0]


def check(name: str, got: dict, recorded: dict[str, dict]) -> None:
    """`got` (steps and weight digests) against the recordings of run `name` (kernel path -> recording): on this
    machine's path, every metric to 1e-6 and the weights bit for bit; on a path not recorded, the first step's
    metrics within `CROSS_PATH_TOL` of every recording (the weights' low bits differ there by construction).

    Only the first step, because the steps after it follow what was sampled: a token one ulp from a tie on another
    path changes the next update, and from then on the runs are two experiments (the Zen 4 host's collocated run
    left the Intel AMX recording at step 5: grad norm 0.744 against 0.759). The first step's samples come from the
    warm-started weights, which differ from the recording's only in their low bits."""
    assert recorded, f"{name}: no recording on any path; record it: python tests/golden/record.py {name}"
    path = kernel_path()
    if path in recorded:
        _compare(name, path, recorded[path]["steps"], got["steps"], {k: 1e-6 for k in CROSS_PATH_TOL})
        assert got["weights"] == recorded[path]["weights"], \
            f"{name}: exported weights differ from the recorded run ({path})"
        return
    print(f"golden {name}: no recording on this path ({path}); step 1 checked against {sorted(recorded)}; "
          f"record it: python tests/golden/record.py {name}")
    for other, recording in recorded.items():
        _compare(name, other, recording["steps"][:1], got["steps"][:1], CROSS_PATH_TOL)


def _compare(name: str, path: str, expected: list[dict], got: list[dict], tolerance: dict[str, float]) -> None:
    assert len(expected) == len(got)
    for step, (want, have) in enumerate(zip(expected, got), start=1):
        for key, value in want.items():
            assert math.isclose(have[key], value, rel_tol=0, abs_tol=tolerance[key]), \
                f"{name} step {step} {key}: {have[key]!r} != {value!r} recorded on {path} (tolerance {tolerance[key]})"


def check_test_run(name: str, history: list[dict], model_dir: Path) -> None:
    """A TEST_RUNS run (its history and exported model) against its recordings, or, under RLINF_GOLDEN_RECORD=name,
    recorded for this machine's kernel path."""
    got = {"steps": metric_steps(history), "weights": weight_digests(model_dir)}
    file = GOLDEN.with_name(f"{name}.json")
    golden = json.loads(file.read_text()) if file.exists() else {"paths": {}}
    if os.environ.get(RECORD_ENV) == name:
        golden["paths"][kernel_path()] = {**got, "commit": _commit()}
        file.write_text(json.dumps(golden, indent=1) + "\n")
        return
    check(name, got, golden["paths"])


def _commit() -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()


def weight_digests(model_dir: Path) -> dict[str, str]:
    from safetensors.torch import load_file

    tensors = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return {k: hashlib.sha256(t.contiguous().view(-1).view(dtype=__import__("torch").uint8).numpy().tobytes())
            .hexdigest() for k, t in sorted(tensors.items())}


def main() -> None:
    import tempfile

    only = sys.argv[1:] or [*RUNS, *TEST_RUNS]  # some runs: their names (the path's other recordings are kept)
    for name in set(only) & set(TEST_RUNS):  # its test runs it, recording instead of checking
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", TEST_RUNS[name]], cwd=ROOT, check=True,
                       env={**os.environ, RECORD_ENV: name})
    only = [name for name in only if name not in TEST_RUNS]
    if not only:
        return
    commit = _commit()
    golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {"common": COMMON, "paths": {}}
    if golden["common"] != COMMON:
        raise SystemExit(f"{GOLDEN} was recorded with {golden['common']}; delete it to record all paths anew")
    recording = {"commit": commit, "runs": {}}
    if set(only) - set(RUNS):
        raise SystemExit(f"no such run {sorted(set(only) - set(RUNS) - set(TEST_RUNS))}; runs: "
                         f"{list(RUNS) + list(TEST_RUNS)}")
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
