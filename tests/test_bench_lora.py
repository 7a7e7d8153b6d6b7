"""`bench/lora.py --quick` runs end to end (a tiny random model, one repetition per side) and its last line
is the benchmark's JSON object."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_run_ends_with_the_json_line():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "lora.py"), "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) == {"bench", "step_time_ratio", "sync_bytes_ratio", "memory_ratio"}
    assert result["bench"] == "lora"
    assert all(result[k] > 0 for k in ("step_time_ratio", "memory_ratio"))
    # all-linear targets on the tiny model: the delta round sends the adapted weights, less than everything
    assert 0 < result["sync_bytes_ratio"] < 1
