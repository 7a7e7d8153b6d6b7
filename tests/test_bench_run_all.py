"""bench/run_all.py's logic on canned output: reading a bench's last JSON line, judging ratios against their
targets, writing the table between the markers of docs/benchmarks.md, and rows for benches that fail or lack a
package. No real benchmark runs here (the fake benches are three-line scripts)."""

from pathlib import Path

from bench import run_all
from bench.common import Machine, median_ratio, result_line
from bench.run_all import BEGIN, END, Bench, Outcome

ROOT = Path(__file__).resolve().parents[1]


def test_every_bench_script_is_run_and_has_targets():
    scripts = {p.name for p in (ROOT / "bench").glob("*.py")} - run_all.SUPPORT
    assert scripts == {b.script for b in run_all.BENCHES}
    assert {b.name for b in run_all.BENCHES} == set(run_all.TARGETS)


def test_last_json_line_is_the_result():
    assert run_all.last_json('settings\nrep 1: 0.5\n{"bench": "x", "ratio": 1.5}\n\n') == {"bench": "x", "ratio": 1.5}
    assert run_all.last_json('{"bench": "x"}\nTraceback: boom\n') is None  # the JSON must be the last line
    assert run_all.last_json("[1, 2]") is None and run_all.last_json("") is None


def test_rows_judge_each_key_by_its_direction():
    channel = Outcome(bench="channel", status="ok", result={
        "bench": "channel", "latency_ratio": 2.045, "throughput": {"1MiB": {"ratio": 0.81}, "64MiB": {"ratio": 0.5}}})
    rows = {r[1]: r for r in run_all.rows(channel)}
    assert rows["`throughput.1MiB.ratio`"][2:] == ["0.810", ">= 0.8", "met"]
    assert rows["`throughput.64MiB.ratio`"][4] == "missed"
    assert rows["`latency_ratio`"][2:] == ["2.045", "<= 2.0", "missed"]  # lower is better here
    sync = run_all.rows(Outcome(bench="weight_sync", status="ok", result={"ratio": 0.2}))
    assert [r[2] for r in sync] == ["not in its output"] * 3 and all(r[4] == "" for r in sync)
    dyn = run_all.rows(Outcome(bench="dynamic_schedule", status="ok", result={"speedup": 1.1,
                                                                              "speedup_vs_collocated": 2.0}))
    assert [(r[2], r[3], r[4]) for r in dyn] == [("1.100", "—", ""), ("2.000", "—", "")]
    [failed] = run_all.rows(Outcome(bench="ppo_vs_sb3", status="skipped: stable_baselines3 not installed"))
    assert failed[2] == "skipped: stable_baselines3 not installed"


def test_table_replaces_only_the_marked_block():
    machine = Machine(info={"cores": 2, "cpu": "Test CPU", "torch": "2.13.0", "python": "3.11", "date": "2026-11-23"},
                      load_start=(1.0, 1.0, 1.0), load_end=(2.0, 2.0, 2.0))
    block = run_all.render([Outcome(bench="rollout", status="ok", result={"ratio": 1.6}, seconds=12)], machine, True)
    assert block.startswith(BEGIN) and block.endswith(END)
    assert "`--quick`" in block and "2 cores (Test CPU)" in block and "1.00 / 1.00 / 1.00 at start" in block
    assert "| rollout | `ratio` | 1.600 | >= 1.5 | met |" in block
    doc = f"# Title\n\nIntro.\n\n{BEGIN}\nold table\n{END}\n\n## Channels\nhand-written\n"
    out = run_all.splice(doc, block)
    assert "old table" not in out and out.count(BEGIN) == 1
    assert out.startswith("# Title\n\nIntro.\n\n") and out.endswith(f"{END}\n\n## Channels\nhand-written\n")
    assert run_all.splice(out, block) == out  # a second run rewrites the same place
    fresh = run_all.splice("# Title\n\nIntro.\n\n## Channels\nx\n", block)  # no markers yet: before the first section
    assert fresh == f"# Title\n\nIntro.\n\n{block}\n\n## Channels\nx\n"


def test_failing_missing_and_good_benches_each_get_a_row(tmp_path, monkeypatch):
    good = tmp_path / "good.py"
    good.write_text('print("rep 1")\nprint(\'{"bench": "rollout", "ratio": 1.2}\')\n')
    bad = tmp_path / "bad.py"
    bad.write_text('print("rep 1")\nraise SystemExit("out of memory")\n')
    ok = run_all.run(Bench(name="rollout", script=str(good)), quick=True)
    assert ok.status == "ok" and ok.result == {"bench": "rollout", "ratio": 1.2}
    failed = run_all.run(Bench(name="rollout", script=str(bad)), quick=False)
    assert failed.status.startswith("failed (exit 1): out of memory") and failed.result is None
    missing = run_all.run(Bench(name="grpo_vs_trl", script=str(good), needs=("no_such_package_xyz",)), quick=True)
    assert missing.status == "skipped: no_such_package_xyz not installed"
    vs = next(b for b in run_all.BENCHES if b.name == "rollout_vs_vllm")
    monkeypatch.setenv("VLLM_PYTHON", str(tmp_path / "no_python"))  # no interpreter with vLLM: a skip, not a failure
    skipped = run_all.run(Bench(name=vs.name, script=str(bad), unavailable=vs.unavailable), quick=True)
    assert skipped.status.startswith("skipped: vllm is not importable by") and "install_vllm_cpu.sh" in skipped.status


def test_result_line_rounds_and_ratio_is_of_medians():
    assert median_ratio([1.0, 9.0, 2.0], [4.0, 4.0, 100.0]) == 0.5  # 2 / 4, not a median of per-rep ratios
    line = result_line("x", ratio=2 / 3, nested={"a": [1 / 3]})
    assert line == '{"bench": "x", "ratio": 0.667, "nested": {"a": [0.333]}}'
