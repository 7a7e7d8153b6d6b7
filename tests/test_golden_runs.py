"""Golden runs: the reasoning runner's behaviour, pinned. `examples/reasoning/main_grpo.py` with a fixed seed,
20 SFT steps and 6 GRPO steps, in process (`golden/record.py` says why): the collocated preset as README's debugging
command places it (one rank a group), the pipelined preset, and PPO (gae, a critic). Several ranks on Ray are pinned by
tests/test_dynamic_schedule.py: its static and dynamic hand-overs (an actor of 2 data-parallel ranks, 2 rollout
replicas) must give each other's metrics and weights bit for bit, and that run is checked against its own recording
(golden/dynamic_schedule.json).

The recordings in golden/reasoning_runs.json are keyed by kernel path (`golden.record.kernel_path`: torch's CPU
capability, the CPU vendor, bf16/AMX units), because MKL and oneDNN choose their kernels by them and the low bits
of a run follow the kernels. On a recorded path every step's reward, loss and grad norm must equal the recording
to 1e-6 and the exported weights must be bit-identical. On a path not yet recorded the metrics must be within
`CROSS_PATH_TOL` of every recording, the gap measured between the paths we have (the weights' low bits differ
there by construction); `python tests/golden/record.py` then records the new path.

Two paths are recorded: a Zen 4 host's (AVX-512 + bf16; only its pipelined run: the PPO and collocated runs moved in
process after it was recorded) and an Intel Xeon's with AMX. A run on a path without its recording (an AVX2 host) is
checked against the others within `CROSS_PATH_TOL` until `python tests/golden/record.py` records it. Each run's
"commit" names the commit it was recorded at (the recording's, for runs recorded before runs had their own).
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
