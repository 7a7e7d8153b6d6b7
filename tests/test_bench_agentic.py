"""`bench/agentic.py --quick` runs end to end (the tiny model, one repetition per side), both sides sample the same
tokens and find the same prefixes in the engine's cache, and its last line is the benchmark's JSON object."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_run_ends_with_the_json_line():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "agentic.py"), "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])
    assert set(result) == {"bench", "throughput_ratio", "ours_tokens_per_s", "lockstep_tokens_per_s", "episodes",
                           "turns", "latency_ms", "lockstep_engine_idle_share", "prefix_cache", "lockstep_turn_tokens",
                           "longest_episode_tokens", "critical_path_s", "critical_path_ratio_bound"}
    assert result["bench"] == "agentic" and result["throughput_ratio"] > 0 and result["episodes"] == 8
    tokens = {side: int(re.search(rf"rep 0 {side}\s*: [\d.]+ s, (\d+) model tokens", done.stdout).group(1))
              for side in ("ours", "lockstep")}
    assert tokens["ours"] == tokens["lockstep"] > 0  # the same episodes, the same per-turn seeds
    assert "{'end reasons': ['answer']," in done.stdout and 0 < result["lockstep_engine_idle_share"] < 1
    # each side starts with a cold prefix cache and finds the same earlier turns in it
    counts = {side: re.search(rf"rep 0 {side}\s*:.*'prefilled': (\d+), 'prefix_hits': (\d+)", done.stdout).groups()
              for side in ("ours", "lockstep")}
    assert counts["ours"] == counts["lockstep"] and int(counts["ours"][1]) > int(counts["ours"][0]) > 0
    assert result["prefix_cache"] is True and result["critical_path_s"] is None
    assert result["lockstep_turn_tokens"] >= result["longest_episode_tokens"] > 0
