"""Golden runs: the reasoning runner's behaviour, pinned. `examples/reasoning/main_grpo.py` with a fixed seed,
20 SFT steps and 6 GRPO steps, on the collocated preset on Ray, the pipelined preset and PPO (gae, a critic) in process
(`golden/record.py` says why). The dynamic schedule has no golden run here: tests/test_dynamic_schedule.py checks
that it gives the static hand-over's metrics and weights bit for bit, and pins that run against its own recording
(golden/dynamic_schedule.json).

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
