"""Rollout worker groups on real Ray: tensor-parallel native engine, weight sync from an FSDP actor,
streaming to a channel, abort from the control thread."""

import pytest

from rlinf_like.hybrid_engines.reshard import SyncPlan
from rlinf_like.models import load_tokenizer
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runtime import Channel, Worker, connect_groups, wait_all
from rlinf_like.workers.rollout import (
    RolloutConfig,
    RolloutRequest,
    RolloutResult,
    SamplingParams,
    continuation,
    make_engine,
)
from rlinf_like.workers.rollout.worker import RolloutWorker, gather_results

PROMPTS = ["12+34=", "hello world, this is", "a", "The quick brown fox jumps over"]
GREEDY = SamplingParams(max_new_tokens=30, temperature=0.0)


class CheckedRollout(RolloutWorker):
    def generate_all(self, requests):  # every rank's results, to check TP ranks agree
        return self.engine.generate(requests)


class FSDPActor(Worker):
    """An actor holding a different checkpoint, sharded dp=2 with FSDP2."""

    def __init__(self, path):
        from transformers import AutoModelForCausalLM

        from rlinf_like.hybrid_engines.fsdp import FSDPModelManager

        self.manager = FSDPModelManager(AutoModelForCausalLM.from_pretrained(path))

    def layouts(self):
        return self.manager.shard_layouts()

    def connect(self, plan):
        from rlinf_like.hybrid_engines.reshard import WeightSender

        self.sender = WeightSender(self.peer_group("weights"), plan, self.rank)

    def publish(self, version):
        return self.sender.publish(version, self.manager.named_shards())


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return (str(write_tiny_model(root / "a", TinyModelSpec(seed=0))),
            str(write_tiny_model(root / "b", TinyModelSpec(seed=1))))


def sync_once(actor, rollout, bucket_bytes: int, timeout: float = 120):
    """Connect the actor's group to the rollout's for weights and send version 1."""
    connect_groups(actor, rollout, "weights")
    [src] = actor.on_ranks(0).layouts().wait()
    [dst] = rollout.on_ranks(0).weight_layouts().wait()
    plan = SyncPlan.build(src, dst, "actor", "rollout", bucket_bytes=bucket_bytes)
    wait_all([actor.connect(plan), rollout.connect_weights("weights", plan)])
    wait_all([actor.publish(1), rollout.apply_weights(1)], timeout=timeout)


def requests(tok, params=GREEDY, n=1, prompts=PROMPTS):
    return [RolloutRequest(f"r{i}", tok(p).input_ids, params, n) for i, p in enumerate(prompts)]


def reference(path, reqs):
    return make_engine(RolloutConfig(dtype="float32", engine="hf", model_path=path)).generate(reqs)


def same_tokens(ours, ref):
    return [r.response_ids for r in ours] == [r.response_ids for r in ref]


def test_tp2_rollout_matches_transformers_then_takes_the_actors_weights(cluster, paths):
    path_a, path_b = paths
    tok = load_tokenizer(path_a)
    reqs = requests(tok)
    placement = cluster.place({"actor,rollout": "0-1"})
    config = RolloutConfig(dtype="float32", model_path=path_a, max_batch_size=8, tp_size=2)
    rollout = CheckedRollout.create_group(config).launch(cluster, placement, "rollout")
    actor = FSDPActor.create_group(path_b).launch(cluster, placement, "actor")
    try:
        rank0, rank1 = rollout.generate_all(reqs).wait()
        assert same_tokens(rank0, rank1)  # both TP ranks sampled the same tokens
        ref_a, ref_b = reference(path_a, reqs), reference(path_b, reqs)
        assert same_tokens(rank0, ref_a) and not same_tokens(rank0, ref_b)
        for ours, ref in zip(rank0, ref_a):
            assert max(abs(p - q) for p, q in zip(ours.logprobs[0], ref.logprobs[0])) < 1e-4
        # requests stopped half-way (as after an abort) continue on the TP engine to the same tokens
        sampled = requests(tok, SamplingParams(max_new_tokens=16, temperature=1.0, seed=5), n=2)
        full, _ = rollout.generate_all(sampled).wait()
        halves = [RolloutResult(r.request_id, r.prompt_ids, [t[: len(t) // 2] for t in r.response_ids],
                                [lp[: len(lp) // 2] for lp in r.logprobs], ["abort"] * 2) for r in full]
        moved = [continuation(q, half) for q, half in zip(sampled, halves)]
        resumed0, resumed1 = rollout.generate_all(moved).wait()
        assert same_tokens(resumed0, full) and same_tokens(resumed1, full)

        sync_once(actor, rollout, bucket_bytes=64 << 10)
        after, nothing = rollout.generate(reqs).wait()  # every TP rank takes part; rank 0 returns
        assert nothing is None
        assert same_tokens(after, ref_b)  # the next generation reflects the new weights
        assert {r.version for r in after} == {1}
    finally:
        rollout.shutdown()
        actor.shutdown()


def test_results_stream_to_a_channel_and_abort_reaches_a_running_generate(cluster, paths):
    path_a, _ = paths
    tok = load_tokenizer(path_a)
    placement = cluster.place({"rollout": "0"})
    rollout = RolloutWorker.create_group(RolloutConfig(dtype="float32", model_path=path_a, max_batch_size=4)).launch(
        cluster, placement, "rollout")
    channel = Channel.create("rollout-results", RolloutResult)
    try:
        short = requests(tok, SamplingParams(max_new_tokens=5, temperature=0.0), prompts=["abc", "xyz"])
        endless = requests(tok, SamplingParams(max_new_tokens=250, temperature=0.0, ignore_eos=True), n=2,
                           prompts=["q"] * 30)
        running = rollout.generate_to("rollout-results", short + endless)
        first = [channel.get(timeout=60) for _ in range(2)]  # the short ones arrive while the rest decodes
        assert sorted(r.request_id for r in first) == ["r0", "r1"]
        rollout.abort().wait(timeout=30)  # runs on the control thread, beside generate_to
        assert running.wait(timeout=60) == [32]
        rest = [channel.get(timeout=30) for _ in range(30)]
        reasons = {reason for r in rest for reason in r.finish_reasons}
        assert "abort" in reasons
    finally:
        rollout.shutdown()
        channel.close()


def test_data_parallel_replicas_split_the_requests_and_each_gets_the_weights(cluster, paths):
    path_a, path_b = paths
    tok = load_tokenizer(path_a)
    reqs = requests(tok, prompts=PROMPTS + ["x*y", "Q: 7-2? A:"])
    placement = cluster.place({"actor,rollout": "0-1"})
    rollout = RolloutWorker.create_group(RolloutConfig(dtype="float32", model_path=path_a, max_batch_size=8, tp_size=1)).launch(
        cluster, placement, "rollout")
    actor = FSDPActor.create_group(path_b).launch(cluster, placement, "actor")
    try:
        per_rank = rollout.generate(reqs).wait()
        assert [len(p) for p in per_rank] == [3, 3]  # two tp=1 replicas, each serving half
        assert {r.request_id for r in per_rank[0]}.isdisjoint(r.request_id for r in per_rank[1])
        assert same_tokens(gather_results(per_rank, reqs), reference(path_a, reqs))

        connect_groups(actor, rollout, "weights")
        [src] = actor.on_ranks(0).layouts().wait()
        [dst] = rollout.on_ranks(0).weight_layouts().wait()
        assert all(len(l.boxes) == 2 and l.boxes[0] == l.boxes[1] for l in dst)  # each replica holds it all
        plan = SyncPlan.build(src, dst, "actor", "rollout")
        wait_all([actor.connect(plan), rollout.connect_weights("weights", plan)])
        wait_all([actor.publish(1), rollout.apply_weights(1)], timeout=120)
        after = gather_results(rollout.generate(reqs).wait(), reqs)
        assert same_tokens(after, reference(path_b, reqs))  # both replicas took the new weights
    finally:
        rollout.shutdown()
        actor.shutdown()
