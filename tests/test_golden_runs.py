"""Golden runs: the reasoning runner's behaviour, pinned. `examples/reasoning/main_grpo.py` with a fixed seed,
20 SFT steps and 6 GRPO steps, in process (`golden/record.py` says why): the collocated preset as README's debugging
command places it (one rank a group), the pipelined preset, and PPO (gae, a critic). Several ranks on Ray are pinned by
tests/test_dynamic_schedule.py: its static and dynamic hand-overs (an actor of 2 data-parallel ranks, 2 rollout
replicas) must give each other's metrics and weights bit for bit, and that run is checked against its own recording
(golden/dynamic_schedule.json).

The recordings in golden/reasoning_runs.json are keyed by kernel path (`golden.record.kernel_path`: torch's CPU
capability, the CPU vendor, bf16/AMX units), because MKL and oneDNN choose their kernels by them and the low bits
of a run follow the kernels. On a recorded path every step's reward, loss and grad norm must equal the recording
to 1e-6 and the exported weights must be bit-identical. On a path not yet recorded only the first step is compared,
within `CROSS_PATH_TOL` of every recording (the gap measured between the paths we have): after it the runs follow
what each path sampled (`golden.record.check` says why); `python tests/golden/record.py` then records the new path.

Three paths are recorded, each run on each: a Zen 4 host's (AVX-512 + bf16), an Intel Xeon's with AMX and an
AVX2-only AMD EPYC's (cpu family 25, `avx2 fma`, no AVX-512). Each run's "commit" names the commit it was recorded at (the recording's, for runs
recorded before runs had their own).
"""

import json

import pytest

from golden.record import GOLDEN, RUNS, check, kernel_path, run

RECORDED = json.loads(GOLDEN.read_text())["paths"]
PATH = kernel_path()


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(RUNS))
def test_golden_run_is_unchanged(name, tmp_path):
    got = run(name, tmp_path / name)  # one run a test: each is timed against the per-test budget on its own
    assert len(got["steps"]) == 6
    check(name, got, {path: r["runs"][name] for path, r in RECORDED.items() if name in r["runs"]})


def test_the_kernel_path_names_the_cpu_capability_and_vendor():
    import torch

    words = PATH.split()
    assert words[0] == torch.backends.cpu.get_cpu_capability() and len(words) >= 2
    assert all(set(r["runs"]) <= set(RUNS) for r in RECORDED.values())  # no recording of a run that is gone


def test_an_unrecorded_path_checks_the_first_step_and_a_recorded_one_every_step_and_the_weights():
    steps = [{"reward": 0.25, "loss": -0.1, "grad_norm": 0.8}, {"reward": 0.5, "loss": -0.2, "grad_norm": 0.7}]
    recording = {"steps": steps, "weights": {"w": "digest"}}
    diverged = {"steps": [steps[0], {"reward": 0.75, "loss": -0.3, "grad_norm": 0.6}], "weights": {"w": "other"}}
    check("r", diverged, {"another path": recording})  # after step 1 the runs may sample apart
    arithmetic_changed = {"steps": [{**steps[0], "loss": -0.1 + 1e-5}, steps[1]], "weights": {}}
    with pytest.raises(AssertionError, match="r step 1 loss"):
        check("r", arithmetic_changed, {"another path": recording})
    with pytest.raises(AssertionError, match="r step 2 reward"):  # on its own path a run is pinned at every step
        check("r", diverged, {PATH: recording})
    with pytest.raises(AssertionError, match="exported weights differ"):
        check("r", {"steps": steps, "weights": {"w": "other"}}, {PATH: recording})
