"""Golden runs: the reasoning runner's behaviour, pinned. `examples/reasoning/main_grpo.py` with a fixed seed,
20 SFT steps and 6 GRPO steps, on the collocated preset and the dynamic schedule with migration (rescored
logprobs) on Ray, the pipelined preset and PPO (gae, a critic) in process (`golden/record.py` says why).

The recordings in golden/reasoning_runs.json are keyed by kernel path (`golden.record.kernel_path`: torch's CPU
capability, the CPU vendor, bf16/AMX units), because MKL and oneDNN choose their kernels by them and the low bits
of a run follow the kernels. On a recorded path every step's reward, loss and grad norm must equal the recording
to 1e-6 and the exported weights must be bit-identical. On a path not yet recorded the metrics must be within
`CROSS_PATH_TOL` of every recording, the gap measured between the paths we have (the weights' low bits differ
there by construction); `python tests/golden/record.py` then records the new path.

First recorded at commit fd38229 (before the runner rebuild of issue 15), again after the native engine's prefix
cache, batched prefill and live-slot decode, and again after the sampler became an inverse-CDF draw (issue 34: every
sampled token changed). Two paths are recorded: a Zen 4 host's (AVX-512 + bf16; its PPO run predates that run's move
in process, so it has none) and an Intel Xeon's with AMX. Any other path (an AVX2 host) is checked against both
within `CROSS_PATH_TOL` until `python tests/golden/record.py` records it. Each run's "commit" names the commit it
was recorded at (the recording's, for runs recorded before runs had their own).
"""

import json
import math

import pytest

from golden.record import GOLDEN, RUNS, kernel_path, run

RECORDED = json.loads(GOLDEN.read_text())["paths"]
PATH = kernel_path()
# Between the AVX2 (AMD EPYC) and the AVX-512 + bf16 (Zen 4) recordings, over all four runs' 6 steps, the largest
# differences were: reward 0 (every sampled token the same), loss 1.5e-7, grad norm 4.4e-6, and every exported
# tensor differed in its low bits. The tolerance is 10x those for loss and grad norm, and for the reward one sample
# of a step's 64 scored otherwise (a token one ulp from a tie may be sampled differently on a third path). The Intel
# Xeon (AMX) recording is within these of the Zen 4 one: reward 0, loss 3.7e-8, grad norm 2.1e-6 at most.
CROSS_PATH_TOL = {"reward": 1 / 64, "loss": 1.5e-6, "grad_norm": 5e-5}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(RUNS))
def test_golden_run_is_unchanged(name, tmp_path):
    got = run(name, tmp_path / name)  # one run a test: each is timed against the per-test budget on its own
    assert len(got["steps"]) == 6
    recorded = {path: r["runs"][name] for path, r in RECORDED.items() if name in r["runs"]}
    assert recorded, f"{name}: no recording on any path; record it: python tests/golden/record.py {name}"
    if PATH in recorded:
        expected = recorded[PATH]
        _compare(name, PATH, expected["steps"], got["steps"], {k: 1e-6 for k in CROSS_PATH_TOL})
        assert got["weights"] == expected["weights"], f"{name}: exported weights differ from the recorded run ({PATH})"
        return
    for path, recording in recorded.items():  # a kernel path not recorded yet: within what paths differ by
        _compare(name, path, recording["steps"], got["steps"], CROSS_PATH_TOL)


def _compare(name: str, path: str, expected: list[dict], got: list[dict], tolerance: dict[str, float]) -> None:
    assert len(expected) == len(got)
    for step, (want, have) in enumerate(zip(expected, got), start=1):
        for key, value in want.items():
            assert math.isclose(have[key], value, rel_tol=0, abs_tol=tolerance[key]), \
                f"{name} step {step} {key}: {have[key]!r} != {value!r} recorded on {path} (tolerance {tolerance[key]})"


def test_the_kernel_path_names_the_cpu_capability_and_vendor():
    import torch

    words = PATH.split()
    assert words[0] == torch.backends.cpu.get_cpu_capability() and len(words) >= 2
    assert all(set(r["runs"]) <= set(RUNS) for r in RECORDED.values())  # no recording of a run that is gone
