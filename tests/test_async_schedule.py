"""runner.schedule=async: the native engine serving continuously with weights changing between decode steps,
the driver's staleness policies (wait, drop), and end-to-end runs (k=0 equals the synchronous schedule;
resume continues from the saved buffer)."""

from pathlib import Path

import pytest

from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.reasoning.async_stream import GroupStream, account, may_start, serve_metrics, staleness_metrics
from rlinf_like.runtime.errors import ChannelTimeout
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, RolloutResult, SamplingParams, make_engine
from small_runs import small_reasoning_config

GREEDY = SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("m"), TinyModelSpec(arch="qwen2"))
    return make_engine(RolloutConfig(engine="native", model_path=str(path), max_batch_size=8))


def serve(engine, arrivals: dict[int, list[RolloutRequest]], switch_at: int | None, new_weights=None):
    """Run engine.serve: `arrivals[k]` join on the k-th source call; before decode step `switch_at` the weights
    become `new_weights` as version 1. Returns the results in finishing order."""
    results, calls, steps = [], [0], [0]

    def source(idle):
        calls[0] += 1
        if calls[0] > max(arrivals) and len(results) == sum(map(len, arrivals.values())):
            return None
        return list(arrivals.get(calls[0], []))

    def between_steps():
        steps[0] += 1
        if steps[0] == switch_at:
            for name, tensor in engine.weights.items():
                tensor.copy_(new_weights[name])
            engine.version = 1

    engine.serve(source, results.append, between_steps)
    return results


def test_serve_switches_weights_between_decode_steps_and_records_each_tokens_version(engine):
    old = {n: t.clone() for n, t in engine.weights.items()}
    new = {n: -t if "lm_head" in n else t for n, t in old.items()}  # a different argmax from the switch on
    prompt = [5, 6, 7, 8]
    try:
        [before] = engine.generate([RolloutRequest("ref-old", prompt, GREEDY)])
        for name, tensor in engine.weights.items():
            tensor.copy_(new[name])
        [after] = engine.generate([RolloutRequest("ref-new", prompt, GREEDY)])
        for name, tensor in engine.weights.items():
            tensor.copy_(old[name])
        engine.version = 0
        [mixed] = serve(engine, {1: [RolloutRequest("mixed", prompt, GREEDY)]}, switch_at=6, new_weights=new)
    finally:
        for name, tensor in engine.weights.items():
            tensor.copy_(old[name])
        engine.version = 0
    versions, tokens = mixed.token_versions[0], mixed.response_ids[0]
    switch = versions.index(1)
    assert 1 < switch < len(tokens) and versions == [0] * switch + [1] * (len(tokens) - switch)
    assert mixed.version == 0 and mixed.oldest_version() == 0
    assert tokens[:switch] == before.response_ids[0][:switch]  # the old weights' tokens up to the switch
    assert tokens != before.response_ids[0] and before.response_ids[0] != after.response_ids[0]


def test_serve_admits_requests_that_arrive_while_others_decode(engine):
    first = [RolloutRequest("a", [5, 6, 7], GREEDY, n=2)]
    late = [RolloutRequest("b", [9, 10], GREEDY), RolloutRequest("c", [11, 12, 13], GREEDY)]
    results = serve(engine, {1: first, 4: late}, switch_at=None)
    assert sorted(r.request_id for r in results) == ["a", "b", "c"]
    alone = engine.generate(first + late)  # same greedy tokens as one static batch
    by_id = {r.request_id: r for r in results}
    assert all(by_id[r.request_id].response_ids == r.response_ids for r in alone)
    assert all(len(v) == 12 for r in results for v in r.token_versions)


@pytest.mark.parametrize("policy,group,steps_done,outstanding,allowed", [
    ("wait", 7, 0, 0, True), ("wait", 8, 0, 0, False), ("wait", 8, 1, 50, True),  # B=4, k=1: draws 0..1 at step 0
    ("drop", 99, 0, 7, True), ("drop", 0, 5, 8, False),  # at most (k+1)*B = 8 out
])
def test_may_start(policy, group, steps_done, outstanding, allowed):
    assert may_start(policy, group, steps_done, outstanding, per_step=4, max_staleness=1) is allowed


class Replica:
    """In-process stand-in for a rollout rank's `submit`: records each request with the weights' version then."""

    def __init__(self, rollout):
        self.rollout = rollout

    def submit(self, requests, key):
        self.rollout.submitted.extend((request, self.rollout.version) for request in requests)
        return self

    def wait(self):
        return [None]


class Rollout:
    world_size = 2

    def __init__(self):
        self.submitted, self.version = [], 0

    def on_ranks(self, rank):
        return Replica(self)


class Finishing:
    """A channel whose groups finish in the order `order` picks from what is submitted, each made by the weights
    it started under (the worst case: no token got newer weights)."""

    def __init__(self, rollout, order):
        self.rollout, self.order, self.sent = rollout, order, set()

    def get(self, key, timeout=None):
        todo = [s for s in self.rollout.submitted if s[0].request_id not in self.sent]
        if not todo:
            raise ChannelTimeout("nothing generating")
        request, version = self.order(todo)
        self.sent.add(request.request_id)
        return RolloutResult(request.request_id, request.prompt_ids, [[1, 2]], [[0.0, 0.0]], ["stop"], version,
                             token_versions=[[version, version]])


def draw(step):
    requests = [RolloutRequest(f"s{step}-{i}", [step, i]) for i in range(2)]
    return requests, [f"problem {step}.{i}" for i in range(2)]


def run_stream(policy, k, order, steps=6, versions_per_step=1):
    rollout = Rollout()
    channel = Finishing(rollout, order)
    stream = GroupStream(rollout=rollout, channel=channel, draw=draw, per_step=2, max_staleness=k, policy=policy)
    taken = []
    for step in range(steps):
        version = rollout.version = step * versions_per_step
        stream.top_up(step)
        got = stream.take(step, version)
        taken.append((got, staleness_metrics(got, version)))
    return taken, rollout


def test_wait_trains_each_draw_in_order_and_never_exceeds_the_bound():
    newest_first = lambda todo: todo[-1]  # a slow rollout for old groups: the newest finish first
    taken, rollout = run_stream("wait", 2, newest_first)
    assert [got.problems for got, _ in taken] == [draw(s)[1] for s in range(6)]
    assert all(m["staleness_max"] <= 2 and m["dropped_groups"] == 0 for _, m in taken)
    assert len(rollout.submitted) == 2 * (5 + 2 + 1)  # at step s, draws up to s + k had started


def test_drop_takes_the_first_to_finish_and_drops_stale_groups():
    oldest_first = lambda todo: todo[0]
    # a slow actor: the versions run ahead (3 per step) while groups wait in the buffer
    taken, _ = run_stream("drop", 1, oldest_first, versions_per_step=3)
    assert sum(m["dropped_groups"] for _, m in taken) > 0
    assert all(m["staleness_max"] <= 1 for _, m in taken)
    assert all(len(got.results) == 2 for got, _ in taken)


def test_serve_metrics_count_every_group_served_not_only_the_ones_trained_on():
    rollout = Rollout()
    stream = GroupStream(rollout=rollout, channel=Finishing(rollout, lambda todo: todo[0]), draw=draw, per_step=2,
                         max_staleness=1, policy="drop")
    taken = []
    for step in range(4):
        rollout.version = 3 * step  # versions run ahead: groups get dropped, yet they were served
        stream.top_up(step)
        taken.append(stream.take(step, rollout.version))
    arrived = sum(len(t.results) + t.dropped for t in taken) + len(stream.finished)
    assert sum(t.dropped for t in taken) > 0
    assert sum(t.served_tokens for t in taken) == 2 * arrived  # each fake group has one 2-token sample
    # a group trained on or dropped leaves no timestamps behind: only groups still out keep theirs
    assert set(stream.arrived_at) == set(stream.finished) and set(stream.submitted_at) <= set(stream.out.values())
    metrics = serve_metrics(taken[-1])
    assert metrics["serve_tokens_per_s"] > 0 and "rollout_s" not in metrics
    assert 0 <= metrics["queued_s_mean"] <= metrics["queued_s_max"]
    assert 0 <= metrics["group_latency_s_mean"] <= metrics["group_latency_s_max"]


def test_groups_that_finish_while_the_trainer_works_are_scored_on_arrival():
    rollout = Rollout()
    scored_on_arrival = []
    stream = GroupStream(rollout=rollout, channel=Finishing(rollout, lambda todo: todo[0]), draw=draw, per_step=2,
                         max_staleness=1, policy="wait",
                         scorer=lambda results, problems: scored_on_arrival.append(problems) or len(scored_on_arrival))
    stream.top_up(0)  # draws 0 and 1 start; replica 0 gets groups 0 and 2 (problems 0.0, 1.0), replica 1 the others
    first = stream.take(0, 0)  # groups finish in submission order: 0.0, 1.0, 0.1
    assert first.scoring == [1, 3] and scored_on_arrival == [["problem 0.0"], ["problem 1.0"], ["problem 0.1"]]
    stream.pump(0.01)  # while step 0 trains: the last group of draw 1 finishes and its reward call starts
    assert scored_on_arrival[3:] == [["problem 1.1"]]
    stream.pump(0.01)  # nothing more is generating: returns after its time
    assert stream.take(1, 1).scoring == [2, 4]


@pytest.mark.parametrize("policy", ["wait", "drop"])
def test_a_stream_restored_after_a_restart_trains_each_group_once_and_loses_none(policy):
    """A stream checkpointed after step 2, with groups still generating and finished ones waiting; it goes on to
    train step 3, then dies. A new stream restored from the checkpoint (a relaunch: everything generated since is
    gone) runs steps 3-5. Its ledger holds steps 0-5 once each and no request id twice; under `wait` it holds every
    group of each step's draw, under `drop` the groups too stale to train are dropped, not trained."""
    import json

    ahead = 3 if policy == "drop" else 1  # drop: the trainer's versions run ahead, so waiting groups go stale

    def run(stream, rollout, steps):
        for step in steps:
            rollout.version = step * ahead
            stream.top_up(step)
            stream.take(step, rollout.version)

    def new_stream():
        rollout = Rollout()
        return GroupStream(rollout=rollout, channel=Finishing(rollout, lambda todo: todo[0]), draw=draw, per_step=2,
                           max_staleness=1, policy=policy), rollout

    stream, rollout = new_stream()
    run(stream, rollout, range(3))
    stream.top_up(3)
    stream.pump(0.01)  # groups of later draws finish while step 2's checkpoint is written
    checkpoint = json.loads(json.dumps(stream.state()))  # as runner.json holds it
    assert checkpoint["finished"] and [e["step"] for e in checkpoint["ledger"]] == [0, 1, 2]
    run(stream, rollout, [3])  # trained, never committed: lost with the dead worker

    restored, rollout = new_stream()
    restored.restore(checkpoint)
    run(restored, rollout, range(3, 6))
    done = account(restored.ledger, 2, policy)
    assert done.complete, str(done)
    assert done.steps == list(range(6)) and done.trained == 12
    if policy == "wait":
        assert [e["trained"] for e in restored.ledger] == [[f"s{s}-0", f"s{s}-1"] for s in range(6)]
    else:
        assert done.dropped > 0  # the restored finished groups were too stale to train on

    # what `account` calls a broken ledger: a group trained twice, a draw's group never trained, a step repeated
    broken = account([{"step": 0, "trained": ["s0-0", "s0-1"], "dropped": []},
                      {"step": 1, "trained": ["s0-1", "s1-1"], "dropped": []}], 2, "wait")
    assert (broken.twice, broken.missing, broken.complete) == (["s0-1"], ["s1-0"], False)
    replayed = account(restored.ledger[:4] + restored.ledger[3:], 2, "drop")  # step 3 twice, as an uncommitted replay
    assert not replayed.complete and replayed.steps[3:5] == [3, 3]


def staleness_0_config(out: Path, schedule: str):
    cfg = small_reasoning_config(out, max_steps=2, save_every=1)
    cfg.cluster.component_placement = {"actor": "0", "rollout": "1", "reward": "0"}
    cfg.cluster.backend = "local"  # in process: the schedules' loops are the subject, not the processes
    cfg.runner.schedule, cfg.rollout.logprobs, cfg.runner.eval_every = schedule, "rescored", 2
    return cfg


def sync_run(tmp: str) -> list:
    """The synchronous (pipelined, k = 0) run."""
    from rlinf_like.runners.reasoning import train

    return train(staleness_0_config(Path(tmp) / "sync", "pipelined")).history


def async_runs(tmp: str) -> tuple[list, object]:
    """The async run with k = 0's history, and the same run resumed from its step-2 checkpoint to step 3."""
    from rlinf_like.runners.reasoning import train

    asyn = train(staleness_0_config(Path(tmp) / "async", "async")).history
    resumed = staleness_0_config(Path(tmp) / "async", "async")
    resumed.runner.max_steps, resumed.runner.resume = 3, True
    return asyn, train(resumed)


@pytest.mark.slow
def test_async_with_staleness_0_equals_the_synchronous_schedule_and_resumes(tmp_path):
    sync = sync_run(str(tmp_path))
    asyn, resumed = async_runs(str(tmp_path))
    more, samples = resumed.history, resumed.extras["samples"]
    keys = ("reward", "policy_loss", "grad_norm", "response_tokens", "eval_accuracy")
    assert all(k in h for h in asyn[1:] for k in keys[:-1]) and "eval_accuracy" in asyn[2]
    for a, b in zip(sync, asyn, strict=True):
        assert {k: a.get(k) for k in keys} == {k: b.get(k) for k in keys}, a["step"]
    assert [h["staleness_max"] for h in asyn[1:]] == [0.0, 0.0]
    # a step boundary means nothing to the serve loops: their throughput is reported, not a rollout phase
    assert all(h["serve_tokens_per_s"] > 0 and "rollout_s" not in h for h in asyn[1:])
    assert [h["step"] for h in more] == [0, 1, 2, 3] and more[3]["staleness_max"] == 0.0
    # the resumed run's ledger continues the checkpoint's: three steps' draws, each group trained on once
    per_step = staleness_0_config(tmp_path, "async").runner.prompts_per_step
    assert samples.complete and samples.steps == [0, 1, 2] and samples.trained == 3 * per_step, str(samples)
