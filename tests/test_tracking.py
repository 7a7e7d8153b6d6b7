"""The tracker interface: TensorBoard scalars and a W&B offline run hold what was logged; the console
table and the fan-out follow the `logger` section."""

import json
import os
import struct
import time

import pytest

from rlinf_like.utils.tracking import (ConsoleTracker, LoggerConfig, TensorBoardTracker, Trackers, WandbTracker,
                                       make_trackers)

METRICS = [({"grpo/reward": 0.25, "grpo/loss": 1.5}, 1), ({"grpo/reward": 0.75, "grpo/loss": 0.5}, 2)]


def test_tensorboard_scalars_are_written_and_read_back(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with make_trackers(LoggerConfig(), tmp_path) as trackers:
        assert [type(t) for t in trackers.trackers] == [TensorBoardTracker]
        for metrics, step in METRICS:
            trackers.log(metrics, step)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("grpo/reward")] == [(1, 0.25), (2, 0.75)]
    assert [(e.step, e.value) for e in events.Scalars("grpo/loss")] == [(1, 1.5), (2, 0.5)]


def test_wandb_offline_run_writes_the_logged_values(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the [wandb] extra (in [dev]) is not installed")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = LoggerConfig(tensorboard=False, wandb=True, wandb_project="test", wandb_name="offline-run")
    with make_trackers(cfg, tmp_path, run_config={"algorithm": {"lr": 1e-3}}) as trackers:
        assert [type(t) for t in trackers.trackers] == [WandbTracker]
        for metrics, step in METRICS:
            trackers.log(metrics, step)
    files = list((tmp_path / "wandb").glob("offline-run-*/*.wandb"))
    assert len(files) == 1, list((tmp_path / "wandb").iterdir())
    deadline = time.monotonic() + 60
    while len(history := _wandb_history(files[0])) < len(METRICS) and time.monotonic() < deadline:
        time.sleep(0.2)  # finish() can return before wandb's service process has written the file
    rows = [{k: row[k] for k in ("_step", "grpo/reward", "grpo/loss")} for row in history]
    assert rows == [{"_step": step, **metrics} for metrics, step in METRICS]


def _wandb_history(path) -> list[dict]:
    """The history rows of an offline run's .wandb file: a leveldb-style log (a 7-byte file header, then
    32 KiB blocks of records, each with a 7-byte header: crc, length, type full/first/middle/last) of
    wandb's Record protobufs; wandb 0.31 writes no summary file offline, and has no reader of its own."""
    from wandb.proto import wandb_internal_pb2

    raw, pos, pending, rows = path.read_bytes(), 7, b"", []
    while pos + 7 <= len(raw):
        left = 32768 - pos % 32768
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7]) if left >= 7 else (0, 0, 0)
        if kind == 0:  # block trailer / padding
            pos += left
            continue
        pending, pos = (pending if kind in (3, 4) else b"") + raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def test_wandb_without_the_package_names_the_extra(monkeypatch, tmp_path):
    import builtins

    real_import = builtins.__import__

    def no_wandb(name, *args, **kwargs):
        if name == "wandb":
            raise ImportError("No module named 'wandb'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_wandb)
    with pytest.raises(ImportError, match=r"\[wandb\] extra"):
        WandbTracker("p", None, tmp_path)


def test_console_table_and_fan_out_go_to_every_tracker():
    lines = []
    seen = []

    class Recorder:
        def log(self, metrics, step):
            seen.append((step, metrics))

        def close(self):
            seen.append("closed")

    with Trackers([ConsoleTracker(write=lines.append, width=8), Recorder()]) as trackers:
        for metrics, step in METRICS:
            trackers.log(metrics, step)
        trackers.log({"grpo/loss": 0.1}, 3)  # a key missing from a row prints as "-"
    assert lines[0].split() == ["step", "o/reward", "rpo/loss"]
    assert lines[1].split() == ["1", "0.25", "1.5"] and lines[3].split() == ["3", "-", "0.1"]
    assert seen[-1] == "closed" and [s[0] for s in seen[:-1]] == [1, 2, 3]


def test_logger_section_picks_the_trackers(tmp_path):
    cfg = LoggerConfig(tensorboard=False, console=True)
    assert [type(t) for t in make_trackers(cfg, tmp_path).trackers] == [ConsoleTracker]
    assert not os.path.exists(tmp_path / "tensorboard")
