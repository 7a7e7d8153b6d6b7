"""The dynamic collocated schedule (`runners/reasoning/schedules/dynamic.py`): same weights and metrics as the
static schedule for the same seed, bit for bit, while unfinished requests migrate to one replica and
the devices go to the actor replica by replica."""

import json
from pathlib import Path

import pytest
import torch
from golden.record import check_test_run

from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.reasoning.schedules import dynamic
from rlinf_like.runners.reasoning.schedules.dynamic import check as check_dynamic
from rlinf_like.runners.reasoning import check_config
from rlinf_like.runtime import ClusterConfig
from rlinf_like.runners.reasoning.schedules.device_handover import DeviceScheduler
from rlinf_like.workers.actor.elastic import block_owners

STEPS = 2
SCHEDULE_ONLY = ("rollout_s", "rollout_tokens_per_s", "elapsed_s", "step_train_s", "sync_s", "step_s",
                 "sched_early_minibatches", "sched_min_dp", "sched_migrated")  # timings and the hand-over itself: the only keys allowed to differ


def small_config(out: Path, schedule: str) -> ReasoningConfig:
    cfg = ReasoningConfig()
    cfg.cluster = ClusterConfig(num_cpus=2, collective_timeout_s=120,
                                component_placement={"actor,rollout": "0-1", "reward": "0"})
    cfg.data.sft_problems, cfg.data.test_problems = 64, 8
    r = cfg.runner
    # 16 groups, 8 per replica: when half are done both replicas are still serving, even when the test shares the
    # cores and one replica runs ahead (with 4 each, one replica once finished all its groups before the driver saw
    # half done, and handed over without a migration)
    r.max_steps, r.prompts_per_step, r.max_new_tokens = STEPS, 16, 12
    cfg.actor.loop.micro_batch_size = 4
    r.sft_steps, r.sft_batch_size, r.eval_every, r.save_every = 4, 16, 100, 100
    r.output_dir, r.schedule = str(out), schedule
    # one group at a time per replica, so both are mid-way when half the groups are done and migrate;
    # logprobs rescored, so a migrated sample's logprobs do not depend on the batch it finished in
    r.migrate_at, cfg.rollout.max_batch_size, cfg.rollout.logprobs = 0.5, 4, "rescored"
    cfg.rollout.dtype = "float32"  # a migrated sample recomputes its keys/values: the same bits in float32 only
    cfg.algorithm.samples_per_prompt, cfg.actor.loop.mini_batches, cfg.algorithm.lr = 4, 4, 1e-3
    cfg.actor.loss.entropy_coef = 0.01  # a gradient every step even where a group's rewards are all equal
    cfg.actor.loop.share_prompt = "false"  # rows one by one, as golden/dynamic_schedule.json recorded them
    # fp32 on every host, as the golden runs: auto trains bf16 where the CPU has bf16 units and fp32 elsewhere, and a
    # host's recording is checked against the others' within the tolerance measured between fp32 paths
    cfg.actor.precision = "fp32"
    return cfg


def test_scheduler_protocol_static_waits_dynamic_hands_over_per_unit():
    for schedule, grants in (("static", [[], [0, 1]]), ("dynamic", [[1], [0, 1]])):
        s = DeviceScheduler([[0], [1]], schedule)
        s.pre_process(0)
        assert s.scale_sync() == ([], [])
        s.offload_sync(1)
        assert s.scale_sync()[0] == grants[0]
        s.offload_sync(0)
        assert s.scale_sync() == (grants[1], [r for r in grants[1] if r not in grants[0]])
        with pytest.raises(RuntimeError, match="unit 0 reported offloaded twice"):
            s.offload_sync(0)
    assert s.dp_sizes(0) == [1, 2]
    s.pre_process(1)
    assert s.plan_migration(0.5, [0, 1], migrate_at=0.0) is None  # off
    assert s.plan_migration(0.4, [0, 1], migrate_at=0.25) is None  # ceil(2 x 0.6) = 2 replicas still needed
    assert s.plan_migration(0.5, [0, 1], migrate_at=0.25) == ([0], [1])
    assert s.plan_migration(1.0, [1], migrate_at=0.5) is None  # all done, one call left: nothing to move
    assert DeviceScheduler([[0], [1], [2], [3]], "dynamic").plan_migration(0.7, [1, 2, 3], 0.5) == ([1, 2], [3])
    s.migrate([1], [0], requests=3)
    s.offload_sync(1)
    with pytest.raises(RuntimeError, match="cannot migrate from units"):
        s.migrate([0], [1], requests=1)  # unit 1 has offloaded
    assert block_owners(4, [0, 2, 3]) == {0: [0, 1], 2: [2], 3: [3]}


def test_bad_schedule_values_are_refused_by_name(tmp_path):
    cfg = small_config(tmp_path, "elastic")
    with pytest.raises(ValueError, match=r"runner.schedule='elastic' is not one of \['static', 'async', 'collocated', 'dynamic', 'pipelined'\]"):
        check_config(cfg)
    cfg = small_config(tmp_path, "static")
    with pytest.raises(ValueError, match=r"runner.migrate_at=0.5 is read by runner.schedule=dynamic only \(got "
                                         r"runner.schedule='static'\)"):
        check_config(cfg)
    cfg = small_config(tmp_path, "dynamic")
    cfg.rollout.engine = "hf"
    with pytest.raises(ValueError, match="rollout.logprobs=rescored is built into the native engine only"):
        check_config(cfg)
    cfg.rollout.logprobs = "sampled"
    with pytest.raises(ValueError, match="runner.migrate_at > 0 needs a rollout engine that continues"):
        check_dynamic(cfg)
    cfg = small_config(tmp_path, "dynamic")
    cfg.algorithm.advantage = "gae"
    with pytest.raises(ValueError, match="runner.schedule=dynamic needs algorithm.advantage = grpo or rloo"):
        check_dynamic(cfg)


def run_schedule(root: Path, handover: str, cluster) -> dict:
    """One hand-over on the test session's Ray (`cluster=`: the run launches its workers there and ends them at its
    end). Returns what the test compares (the scheduler's record, not the scheduler)."""
    result = dynamic.train(small_config(root / handover, "dynamic"), handover=handover, cluster=cluster)
    scheduler = result.extras["scheduler"]
    return {"history": result.history, "dp_sizes": [scheduler.dp_sizes(step) for step in range(STEPS)],
            "events": [(e.step, e.kind, e.detail) for e in scheduler.events]}


@pytest.mark.timeout(600)  # two runs, one after the other
def test_dynamic_schedule_equals_static_bit_for_bit(tmp_path, cluster):
    runs = {h: run_schedule(tmp_path, h, cluster) for h in ("static", "dynamic")}
    static, dynamic = runs["static"], runs["dynamic"]

    # the migration and hand-over happened: under dynamic, half-way through every step both replicas
    # stopped, the unfinished requests (their samples part-done) went on on replica 0, replica 1's
    # device went to the actor alone (DP 1), and replica 0's joined at the end (DP 2, taking the state by
    # broadcast); static granted both at once and never migrated.
    assert static["dp_sizes"] == [[2]] * STEPS
    assert all(s == [1, 2] for s in dynamic["dp_sizes"]), dynamic["dp_sizes"]
    for step in range(STEPS):
        kinds = [kind for s, kind, _ in dynamic["events"] if s == step]
        assert kinds == ["pre_process", "migrate", "offload_sync", "scale_sync", "offload_sync", "scale_sync"], \
            dynamic["events"]
        [moved] = [detail for s, kind, detail in dynamic["events"] if s == step and kind == "migrate"]
        assert moved["drained"] == [1] and moved["kept"] == [0] and moved["requests"] >= 2
    assert [kind for _, kind, _ in static["events"]].count("migrate") == 0
    assert [kind for step, kind, _ in static["events"] if step == STEPS - 1][-2:] == ["offload_sync", "scale_sync"]

    # ... and changed nothing: every metric and every exported weight is identical
    for a, b in zip(static["history"], dynamic["history"], strict=True):
        common = {k: v for k, v in a.items() if k not in SCHEDULE_ONLY}
        assert common == {k: v for k, v in b.items() if k not in SCHEDULE_ONLY}
    assert all(h["grad_norm"] > 0 for h in static["history"][1:])  # every GRPO step moved the weights

    from safetensors.torch import load_file

    final = {n: load_file(tmp_path / n / "final_model" / "model.safetensors") for n in runs}
    init = load_file(tmp_path / "static" / "init_model" / "model.safetensors")
    assert final["static"].keys() == final["dynamic"].keys()
    assert all(torch.equal(final["static"][k], final["dynamic"][k]) for k in final["static"])
    assert any(not torch.equal(final["static"][k], init[k]) for k in init if k in final["static"])
    saved = json.loads((tmp_path / "dynamic" / "checkpoint" / "runner.json").read_text())
    assert saved["step"] == STEPS
    # ... and what both compute is pinned: every step's reward, loss and grad norm and the exported weights against
    # the recording for this kernel path (tests/golden/dynamic_schedule.json), as the golden runs pin the presets
    check_test_run("dynamic_schedule", dynamic["history"], tmp_path / "dynamic" / "final_model")
