"""`bench/lora.py --quick` runs end to end (a tiny random model, one repetition per side) and its last line
is the benchmark's JSON object."""

import pytest
from quick_bench import run_quick


@pytest.mark.extended  # the LoRA path's exactness and its delta sync are tests/test_lora.py's, in the default suite
def test_quick_run_ends_with_the_json_line():
    _, result = run_quick("lora.py")
    assert set(result) == {"bench", "step_time_ratio", "sync_bytes_ratio", "memory_ratio"}
    assert result["bench"] == "lora"
    assert all(result[k] > 0 for k in ("step_time_ratio", "memory_ratio"))
    # all-linear targets on the tiny model: the delta round sends the adapted weights, less than everything
    assert 0 < result["sync_bytes_ratio"] < 1
