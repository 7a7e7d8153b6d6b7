"""`bench/agentic.py --quick` runs end to end (the tiny model, one repetition per side), both sides sample the same
tokens and find the same prefixes in the engine's cache, and its last line is the benchmark's JSON object."""

import ast
import re

from quick_bench import run_quick
from rlinf_like.workers.rollout.agentic.episode import END_REASONS


def test_quick_run_ends_with_the_json_line():
    stdout, result = run_quick("agentic.py")
    assert set(result) == {"bench", "throughput_ratio", "ours_tokens_per_s", "lockstep_tokens_per_s", "episodes",
                           "turns", "latency_ms", "lockstep_engine_idle_share", "prefix_cache", "lockstep_turn_tokens",
                           "longest_episode_tokens", "critical_path_s", "critical_path_ratio_bound"}
    assert result["bench"] == "agentic" and result["throughput_ratio"] > 0 and result["episodes"] == 8
    tokens = {side: int(re.search(rf"rep 0 {side}\s*: [\d.]+ s, (\d+) model tokens", stdout).group(1))
              for side in ("ours", "lockstep")}
    assert tokens["ours"] == tokens["lockstep"] > 0  # the same episodes, the same per-turn seeds
    # which reasons the episodes ended for is what this CPU's kernels happened to sample; that each ended for one
    # of the loop's reasons, and the printed episode summary, hold on any CPU
    reasons = ast.literal_eval(re.search(r"rep 0 ours\s*:.*'end reasons': (\[[^\]]*\])", stdout).group(1))
    assert reasons and set(reasons) <= set(END_REASONS), reasons
    assert 0 < result["lockstep_engine_idle_share"] < 1
    # each side starts with a cold prefix cache and finds the same earlier turns in it
    counts = {side: re.search(rf"rep 0 {side}\s*:.*'prefilled': (\d+), 'prefix_hits': (\d+)", stdout).groups()
              for side in ("ours", "lockstep")}
    assert counts["ours"] == counts["lockstep"] and int(counts["ours"][1]) > int(counts["ours"][0]) > 0
    assert result["prefix_cache"] is True and result["critical_path_s"] is None
    assert result["lockstep_turn_tokens"] >= result["longest_episode_tokens"] > 0
