"""Running a benchmark script's `--quick` mode from a test: its stdout and the JSON object of its last line."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_quick(script: str, timeout: int = 240) -> tuple[str, dict]:
    """`bench/<script> --quick` in a subprocess (one thread per process); fails the test with its stderr's tail."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(done.stdout.strip().splitlines()[-1])
