"""Golden runs: the reasoning runner's behaviour, pinned. `examples/reasoning/main_grpo.py` with a fixed seed,
20 SFT steps and 6 GRPO steps, on the collocated preset, the pipelined preset, the dynamic schedule with
migration (rescored logprobs) and PPO (gae, a critic). Every step's reward, loss and grad norm must equal the
recorded values to 1e-6 and the exported weights must be bit-identical.

The values in golden/reasoning_runs.json were first recorded by `tests/golden/record.py` at commit fd38229
(before the runner rebuild of issue 15), and recorded again after the native engine's prefix cache, batched
prefill and live-slot decode (2026-11-23): the engine's sampled logprobs then round differently (batches of other
shapes), so every step's metrics stayed within 2e-7 of the first recording while the exported weights changed
in their last bits (the dynamic run, whose logprobs are rescored, stayed bit-identical). Its "commit" field
names the commit it was recorded at.
"""

import json
import math
from concurrent.futures import ThreadPoolExecutor

import pytest

from golden.record import GOLDEN, RUNS, run

RECORDED = json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """All four runs, two at a time (each its own local Ray; the numbers do not depend on timing: the
    pipelined order is fixed and the dynamic schedule is bit-identical to its static hand-over)."""
    root = tmp_path_factory.mktemp("golden")
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(run, name, root / name) for name in RUNS}
    return {name: future.exception() or future.result() for name, future in futures.items()}


@pytest.mark.timeout(1200)  # the first test waits for all four runs
@pytest.mark.parametrize("name", list(RUNS))
def test_golden_run_is_unchanged(name, runs):
    expected, got = RECORDED["runs"][name], runs[name]
    if isinstance(got, BaseException):
        raise got
    assert len(got["steps"]) == len(expected["steps"]) == 6
    for step, (want, have) in enumerate(zip(expected["steps"], got["steps"]), start=1):
        for key, value in want.items():
            assert math.isclose(have[key], value, rel_tol=0, abs_tol=1e-6), \
                f"{name} step {step} {key}: {have[key]!r} != recorded {value!r}"
    assert got["weights"] == expected["weights"], f"{name}: exported weights differ from the recorded run"
