"""bench/run_all.py's logic on canned output: reading a bench's last JSON line, judging ratios against their
targets, writing the table between the markers of docs/benchmarks/index.md, and rows for benches that fail or lack a
package. No real benchmark runs here (the fake benches are three-line scripts)."""

from pathlib import Path

from bench import run_all, summary_table
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
    assert rows["`throughput.1MiB.ratio`"][2:5] == ["0.810", ">= 0.8", "met"]
    assert rows["`throughput.64MiB.ratio`"][4] == "missed"
    assert rows["`latency_ratio`"][2:5] == ["2.045", "<= 2.0", "missed"]  # lower is better here
    sync = run_all.rows(Outcome(bench="weight_sync", status="ok", result={"ratio": 0.2}))
    assert [r[2] for r in sync] == ["not in its output"] * 3 and all(r[4] == "" for r in sync)
    dyn = run_all.rows(Outcome(bench="dynamic_schedule", status="ok", result={"speedup": 1.1,
                                                                              "speedup_vs_collocated": 2.0}))
    assert [(r[2], r[3], r[4]) for r in dyn] == [("1.100", "—", ""), ("2.000", "—", "")]
    [failed] = run_all.rows(Outcome(bench="ppo_vs_sb3", status="skipped: stable_baselines3 not installed"))
    assert failed[2] == "skipped: stable_baselines3 not installed"


MACHINE = Machine(info={"cores": 2, "cpu": "Test CPU", "isa": "avx2 fma", "torch": "2.13.0", "python": "3.11",
                        "date": "2026-11-23"},
                  load_start=(1.0, 1.0, 1.0), load_end=(2.0, 2.0, 2.0))


def outcome(bench: str, quick: bool, **result) -> Outcome:
    return Outcome(bench=bench, status="ok", result={"bench": bench, **result}, seconds=12, quick=quick,
                   started="2026-11-23 10:00", load=(1.0, 2.5))


def test_table_replaces_only_the_marked_block():
    block = summary_table.render(run_all.table([outcome("rollout", True, ratio=1.6)], MACHINE))
    assert block.startswith(BEGIN) and block.endswith(END) and "2 cores (Test CPU; avx2 fma)" in block
    assert "| rollout | `ratio` | 1.600 | >= 1.5 | met | **quick** 2026-11-23 10:00, 12 s, load 1.00 → 2.50 |" in block
    doc = f"# Title\n\nIntro.\n\n{BEGIN}\nold table\n{END}\n\n## Channels\nhand-written\n"
    out = run_all.splice(doc, block)
    assert "old table" not in out and out.count(BEGIN) == 1
    assert out.startswith("# Title\n\nIntro.\n\n") and out.endswith(f"{END}\n\n## Channels\nhand-written\n")
    assert run_all.splice(out, block) == out  # a second run rewrites the same place
    fresh = run_all.splice("# Title\n\nIntro.\n\n## Channels\nx\n", block)  # no markers yet: before the first section
    assert fresh == f"# Title\n\nIntro.\n\n{block}\n\n## Channels\nx\n"


def test_table_reads_back_exactly_and_a_merge_replaces_only_the_named_benches():
    first = run_all.table([outcome("channel", True, latency_ratio=1.9), outcome("rollout", True, ratio=1.2),
                           outcome("packing", True, speedup=1.4)], MACHINE)
    block = summary_table.render(first)
    assert summary_table.render(summary_table.parse(block)) == block  # round trip, byte for byte
    assert summary_table.parse(block).rows == first.rows
    full = outcome("rollout", False, ratio=1.55)
    full.flags = ("--reps", "5")
    merged = summary_table.merge(summary_table.parse(block), run_all.table([full], MACHINE),
                                 [b.name for b in run_all.BENCHES])
    assert list(merged.rows) == ["channel", "rollout", "packing"]  # run_all's order, not the order of the runs
    assert merged.rows["channel"] == first.rows["channel"] and merged.rows["packing"] == first.rows["packing"]
    assert merged.rows["rollout"] == [
        "| rollout | `ratio` | 1.550 | >= 1.5 | met | full 2026-11-23 10:00, 12 s, load 1.00 → 2.50, `--reps 5` |"]
    again = summary_table.render(merged)
    assert summary_table.render(summary_table.parse(again)) == again
    added = summary_table.merge(merged, run_all.table([outcome("offload", False, offload_ratio=0.9)], MACHINE),
                                [b.name for b in run_all.BENCHES])
    assert list(added.rows) == ["channel", "offload", "rollout", "packing"]


OLD_BLOCK = f"""{BEGIN}

## Summary: the latest `bench/run_all.py` run (generated; edit `bench/run_all.py`, not this table)

2026-11-23 08:24, `--quick` (smoke sizes: ratios are not the benches' measurements); 2 cores (AMD EPYC), torch \
2.13.0+cpu, python 3.11.7; load average 11.46 / 6.10 / 4.68 at start, 1.43 / 3.11 / 4.61 at end. Each bench ran \
alone, in its own process.

| bench | ratio | value | target | |
|---|---|---|---|---|
| channel | `latency_ratio` | 1.939 | <= 2.0 | met |
| offload | `offload_ratio` | 0.430 | >= 0.8 | missed |
| offload | `onload_ratio` | 0.325 | >= 0.8 | missed |

Wall time 171 s: channel 158 s, offload 13 s.

{END}"""


def test_the_older_single_run_table_is_read_with_its_run_as_each_rows_provenance():
    old = summary_table.parse(OLD_BLOCK)
    assert old.machine == "Machine: 2 cores (AMD EPYC), torch 2.13.0+cpu, python 3.11.7."
    assert old.rows["offload"] == [
        "| offload | `offload_ratio` | 0.430 | >= 0.8 | missed | **quick** 2026-11-23 08:24, 13 s, whole-run load "
        "11.46 → 1.43 |",
        "| offload | `onload_ratio` | 0.325 | >= 0.8 | missed | **quick** 2026-11-23 08:24, 13 s, whole-run load "
        "11.46 → 1.43 |"]
    assert old.rows["channel"][0].endswith("| **quick** 2026-11-23 08:24, 158 s, whole-run load 11.46 → 1.43 |")


def test_merge_run_writes_only_its_bench(tmp_path, monkeypatch):
    script = tmp_path / "fake.py"
    script.write_text('print("rep 1")\nprint(\'{"bench": "offload", "offload_ratio": 0.95, "onload_ratio": 0.9}\')\n')
    doc = tmp_path / "index.md"
    doc.write_text(f"# B\n\n{OLD_BLOCK}\n\n## Offload\nhand-written\n")
    monkeypatch.setattr(run_all, "DOC", doc)
    monkeypatch.setattr(run_all, "BENCHES", (Bench(name="offload", script=str(script)),))
    run_all.main(["--merge", "--only", "offload", "--extra", "--reps 3"])
    table = summary_table.parse(summary_table.block_of(doc.read_text()))
    assert table.rows["channel"] == summary_table.parse(OLD_BLOCK).rows["channel"]  # kept as it was
    [offload, onload] = table.rows["offload"]
    assert offload.startswith("| offload | `offload_ratio` | 0.950 | >= 0.8 | met | full ")
    assert offload.endswith(", `--reps 3` |") and "whole-run" not in onload
    assert doc.read_text().endswith(f"{END}\n\n## Offload\nhand-written\n")


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
