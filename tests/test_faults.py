"""Faults at runner level, through the example scripts as a user runs them (each run a subprocess with
its own local Ray): the driver killed in the middle of a save, a worker killed in the middle of a step.
Each time the run stops, the last complete checkpoint is intact, and resuming continues from it."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from rlinf_like.runners.common import CRASH_ENV

ROOT = Path(__file__).resolve().parents[1]
GRPO = ROOT / "examples" / "reasoning" / "main_grpo.py"
# the smallest run that still trains: 3 processes (actor | rollout + reward), on-policy so that a resumed
# run can equal an uninterrupted one, no SFT; the entropy bonus gives a gradient while every reward is 0
SMALL = ["data.test_problems=4", "data.sft_problems=20", "model.hidden_size=32", "model.intermediate_size=64",
         "model.num_heads=2", "model.num_kv_heads=1"]
TINY_GRPO = ["--config-name", "grpo_pipelined", "runner.max_staleness=0", "runner.sft_steps=0", *SMALL,
             "runner.prompts_per_step=4", "algorithm.samples_per_prompt=2", "runner.max_new_tokens=8",
             "actor.loop.micro_batch_size=8", "actor.loss.entropy_coef=0.01", "runner.max_steps=6", "runner.save_every=2",
             "runner.eval_every=100"]


def start(script: Path, out: Path, *overrides: str, crash_at: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    env.pop(CRASH_ENV, None)
    if crash_at:
        env[CRASH_ENV] = crash_at
    out.mkdir(parents=True, exist_ok=True)
    log = open(out.parent / f"{out.name}.{time.monotonic_ns()}.log", "w+")  # a file: a full pipe cannot block it
    proc = subprocess.Popen([sys.executable, str(script), *overrides, f"runner.output_dir={out}"], cwd=ROOT, env=env,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log = log
    return proc


def finish(proc: subprocess.Popen, timeout: float = 400) -> str:
    proc.wait(timeout=timeout)
    with proc.log:
        proc.log.seek(0)
        return proc.log.read()


def runner_state(out: Path) -> dict:
    return json.loads((out / "checkpoint" / "runner.json").read_text())


def copy_committed(ckpt: Path, dest: Path) -> None:
    """The committed checkpoint (runner.json and the step directory it names) copied while its run goes on.
    Only that one: a commit deletes the older step directories right after flipping runner.json."""
    state = (ckpt / "runner.json").read_text()
    step_dir = json.loads(state)["checkpoint"]
    shutil.copytree(ckpt / step_dir, dest / step_dir)
    (dest / "runner.json").write_text(state)


def wait_until_gone(pids: list[int], timeout: float = 30) -> list[int]:
    """The pids still alive after `timeout` (zombies count as gone)."""
    deadline = time.monotonic() + timeout
    while True:
        alive = [p for p in pids if Path(f"/proc/{p}").exists()
                 and ") Z" not in Path(f"/proc/{p}/stat").read_text()]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def same_tensors(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_tensors(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_tensors(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return np.array_equal(a, b)
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b


def actor_state(checkpoint: Path, tmp: Path) -> dict:
    """An actor checkpoint's weights, optimizer state, scheduler, step and RNG, in one process."""
    single = tmp / f"{checkpoint.parent.name}-{time.monotonic_ns()}.pt"
    dcp_to_torch_save(checkpoint / "dcp", single)
    state = torch.load(single, weights_only=False)
    return {**state, "extra": torch.load(checkpoint / "extra_rank0.pt", weights_only=False)}


@pytest.fixture
def procs():
    started: list[subprocess.Popen] = []
    yield started
    for p in started:  # a failed assertion must not leave a run (and its Ray) behind
        if p.poll() is None:
            p.kill()
            p.wait()


@pytest.mark.timeout(900)  # ~1 min on a quiet 2-core machine; the bound is for a heavily shared one
def test_reasoning_run_resumes_after_a_crash_during_a_save_and_a_killed_worker(tmp_path, procs):
    run, ckpt = tmp_path / "run", tmp_path / "run" / "checkpoint"
    # 1. the driver dies (SIGKILL) after the actor wrote step 4's state, before runner.json names it
    procs.append(crashed := start(GRPO, run, *TINY_GRPO, crash_at="checkpoint:4"))
    log = finish(crashed)
    assert crashed.returncode == -signal.SIGKILL, log[-3000:]
    committed = runner_state(run)
    assert (committed["step"], committed["checkpoint"]) == (2, "step_2")  # the previous complete checkpoint
    assert [h["step"] for h in committed["history"]] == [0, 1, 2]
    assert (ckpt / "step_2" / "actor").is_dir() and (ckpt / "step_4" / "actor").is_dir()  # 4: never committed
    shutil.copytree(ckpt / "step_4", tmp_path / "uncommitted_step_4")  # what an uninterrupted run has at step 4
    shutil.copytree(ckpt / "step_2", tmp_path / "step_2")
    workers = [p for ps in json.loads((run / "workers.json").read_text()).values() for p in ps]

    # 2. resumed from step 2 with one restart allowed; once step 4 is committed (its state copied aside: where a
    # fault-free run stands), the actor's process is SIGKILLed during step 5. The run recovers by itself: it names
    # the dead worker, relaunches every group, resumes from step 4 and ends with rc 0
    procs.append(resumed := start(GRPO, run, *TINY_GRPO, "runner.resume=true", "runner.max_restarts=1"))
    assert not wait_until_gone(workers)  # the dead driver's workers went with it (while the new run starts)
    while resumed.poll() is None and runner_state(run)["step"] < 4:
        time.sleep(0.02)
    assert resumed.poll() is None, finish(resumed)[-3000:]  # still running, in step 5 or later
    committed_4, straight = tmp_path / "committed_4", tmp_path / "straight"
    copy_committed(ckpt, committed_4 / "checkpoint")
    at_kill = runner_state(committed_4)
    actor_pid = json.loads((run / "workers.json").read_text())["actor"][0]
    assert actor_pid not in workers
    os.kill(actor_pid, signal.SIGKILL)
    # 3 starts now, beside the recovery, from its own copy of the step-4 checkpoint (its commits delete step 4 there):
    # the test's wall is mostly the two runs' start-up and the relaunch waiting on its processes
    shutil.copytree(committed_4, straight)
    procs.append(final := start(GRPO, straight, *TINY_GRPO, "runner.resume=true", "cluster.backend=local"))
    log = finish(resumed, timeout=300)  # no hang
    assert resumed.returncode == 0, log[-3000:]
    assert "resumed at step 2" in log and "resumed at step 4" in log, log[-3000:]
    assert "fault 1 of at most 1: actor[rank 0] died during" in log, log[-3000:]  # the log names the worker
    [fault] = [json.loads(line) for line in (run / "faults.jsonl").read_text().splitlines()]
    assert (fault["group"], fault["rank"], fault["resumed_from"]) == ("actor", 0, 4)
    assert fault["step"] in (4, 5) and fault["replayed_steps"] == fault["step"] - 4
    assert json.loads((run / "workers.json").read_text())["actor"][0] != actor_pid  # the relaunched workers' pids
    assert (at_kill["step"], at_kill["checkpoint"]) == (4, "step_4")
    assert at_kill["history"][:3] == committed["history"]
    # steps 3-4 replayed from the step-2 checkpoint end bit-identical to the crashed run's own steps 3-4:
    # weights, Adam moments, scheduler, step counter and RNG were all restored
    replayed = actor_state(committed_4 / "checkpoint" / "step_4" / "actor", tmp_path)
    original = actor_state(tmp_path / "uncommitted_step_4" / "actor", tmp_path)
    assert replayed["extra"]["step"] == 4 and same_tensors(replayed, original)
    before = actor_state(tmp_path / "step_2" / "actor", tmp_path)
    assert not same_tensors(before["model"], replayed["model"])  # steps 3-4 did change the weights

    # 3. the fault-free run from step 4 to the end, in process (one rank a group, as on Ray here; a checkpoint Ray
    # wrote resumes on either backend): the recovered run's final state and history are its, bit for bit
    log = finish(final)
    assert final.returncode == 0 and "resumed at step 4" in log, log[-3000:]
    history = runner_state(straight)["history"]
    assert history[:5] == at_kill["history"] and [h["step"] for h in history] == list(range(7))
    assert all(h["grad_norm"] > 0 and h["skipped"] == 0 for h in history[1:])
    untimed = lambda rows: [{k: v for k, v in h.items() if not k.endswith(("_s", "tokens_per_s"))} for h in rows]
    assert untimed(runner_state(run)["history"]) == untimed(history)
    assert same_tensors(actor_state(ckpt / "step_6" / "actor", tmp_path),
                        actor_state(straight / "checkpoint" / "step_6" / "actor", tmp_path))


def test_a_dead_worker_beyond_max_restarts_stops_the_run_naming_every_fault(tmp_path):
    from rlinf_like.runtime.errors import WorkerDiedError
    from rlinf_like.runtime.recovery import RestartsExhaustedError, fault_metrics, read_faults, run_with_restarts

    deaths = [WorkerDiedError("rollout", 1, "generate", "SIGKILL"), WorkerDiedError("actor", 0, "train_step", "OOM")]
    resumes = []

    def attempt(resume: bool):
        resumes.append(resume)
        if deaths:
            raise deaths.pop(0)
        return "done"

    # within the bound: the second attempt on resumes and the fault is written down
    assert run_with_restarts(attempt, max_restarts=2, resume=False, out=tmp_path, committed_step=lambda: 2) == "done"
    assert resumes == [False, True, True]
    faults = read_faults(tmp_path)
    assert [(f["group"], f["resumed_from"]) for f in faults] == [("rollout", 2), ("actor", 2)]
    assert fault_metrics(faults) == {"restarts": 2.0, "replayed_steps": 0.0, "restarts/rollout": 1.0,
                                     "restarts/actor": 1.0}
    # beyond it: an error naming every fault; with 0 restarts the worker's own error, as before
    deaths[:] = [WorkerDiedError("reward", 0, "score", "SIGKILL"), WorkerDiedError("reward", 0, "score", "again")]
    with pytest.raises(RestartsExhaustedError, match=r"(?s)2 worker faults, over runner.max_restarts=1:.*"
                                                     r"1\. reward\[rank 0\] died during score\(\).*SIGKILL.*2\. .*again"):
        run_with_restarts(attempt, max_restarts=1, resume=False, out=tmp_path / "b", committed_step=lambda: None)
    deaths[:] = [WorkerDiedError("reward", 0, "score", "SIGKILL")]
    with pytest.raises(WorkerDiedError, match=r"reward\[rank 0\] died during score"):
        run_with_restarts(attempt, max_restarts=0, resume=False, out=tmp_path, committed_step=lambda: None)
    assert read_faults(tmp_path) == []  # a fresh run in the folder starts without the earlier run's faults


def compose_grpo(*overrides: str):
    """What main_grpo.py does before the runner starts: hydra composes the preset over the schema."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    from rlinf_like.config import hydra_schema, structure
    from rlinf_like.runners.reasoning.config import ReasoningConfig

    ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))
    with initialize_config_dir(str(GRPO.parent / "config"), version_base="1.3"):
        return structure(ReasoningConfig, compose("grpo_collocated", list(overrides)))


def test_a_wrongly_typed_value_is_named():
    # hydra checks override types against the schema: the message names the override and the type wanted
    for override, wanted in (("runner.max_steps=ten", "Integer"), ("runner.resume=maybe", "not a valid bool"),
                             ("algorithm.lr=fast", "Float")):
        with pytest.raises(Exception) as err:
            compose_grpo(override)
        message = f"{err.value}: {err.value.__cause__}"
        assert f"Error merging override {override}" in message and wanted in message, message
        assert f"full_key: {override.split('=')[0]}" in message


@pytest.mark.parametrize("placement,overrides,error", [
    ({"actor": "0-3", "rollout": "0-1", "reward": "0"}, [],
     r"cluster.component_placement.actor='0-3' \(component 'actor'\) uses cpu devices 2-3, but the cluster has 2 "
     r"cpu device\(s\) \(valid: 0-1\)"),
    ({"actor": "0", "rollout,reward": "1"}, ["algorithm.advantage=gae"],
     r"places no \['critic'\] \(critic: with algorithm.advantage=gae\)"),
    (None, ["runner.prompts_per_step=1", "algorithm.samples_per_prompt=3"],
     r"= 3 rows per step do not divide by actor ranks \(2\) x actor.loop.mini_batches \(1\)"),
])
def test_impossible_placements_and_batch_splits_fail_before_any_worker_starts(cluster, tmp_path, placement,
                                                                               overrides, error):
    from rlinf_like.algorithms import build_estimator
    from rlinf_like.runners.reasoning.launch import launch_workers
    from rlinf_like.runners.reasoning import check_config

    cfg = compose_grpo(f"runner.output_dir={tmp_path}", *SMALL, *overrides)
    cfg.cluster.component_placement = placement or cfg.cluster.component_placement
    check_config(cfg)
    estimator = build_estimator(cfg.algorithm.advantage, cfg.algorithm)
    with pytest.raises(ValueError, match=error):  # on the test session's 2-CPU Ray
        launch_workers(cfg, cluster, str(tmp_path / "no-model"), estimator, tmp_path)
    assert not (tmp_path / "workers.json").exists()  # nothing launched
