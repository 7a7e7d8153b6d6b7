"""The native engine's paged KV cache: exact tokens with many small blocks and ragged lengths, preemption
when the budget is short, the too-small-budget error, the start-up log, the real model's footprint at
default settings, and the vocabulary-parallel embedding / LM head under TP=2 (shapes, tokens, sync)."""

import logging
import os

import psutil
import pytest
import torch

from rlinf_like.hybrid_engines.reshard import SyncPlan
from rlinf_like.models import load_tokenizer
from rlinf_like.models.families import ModelConfig
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runtime import Worker, connect_groups, wait_all
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine
from rlinf_like.workers.rollout.engines.native.model import kv_bytes_per_token
from rlinf_like.workers.rollout.engines.native.paging import GIB
from rlinf_like.workers.rollout.worker import RolloutWorker

# prompts of very different lengths (1 to ~90 characters = tokens), answers of very different lengths
PROMPTS = ["a", "12+34=", "The quick brown fox jumps over the lazy dog, then over the lazy cat, and then sleeps",
           "hello world, this is", "x*y", "Q: 7-2? A: 5. Q: 9-3? A: 6. Q: 8-1? A:"]
MAX_NEW = [70, 3, 40, 100, 17, 55]


@pytest.fixture(scope="module", params=["llama", "qwen3-tied"])
def model_path(request, tmp_path_factory):
    spec = (TinyModelSpec(arch="llama") if request.param == "llama"
            else TinyModelSpec(arch="qwen3", tie_word_embeddings=True))
    return str(write_tiny_model(tmp_path_factory.mktemp(request.param), spec))


def ragged_requests(tok, temperature=0.0, n=2, seed=None):
    return [RolloutRequest(f"r{i}", tok(p).input_ids,
                           SamplingParams(max_new_tokens=m, temperature=temperature, ignore_eos=True, seed=seed), n)
            for i, (p, m) in enumerate(zip(PROMPTS, MAX_NEW))]


def native(path, **kw):  # float32: these tests compare bits (tests/greedy_contract.py)
    return make_engine(RolloutConfig(engine="native", model_path=path, **{"dtype": "float32", **kw}))


def budget_for(path, blocks, block_size):
    """kv_cache_memory_gb holding exactly `blocks` usable blocks (plus the scratch block)."""
    return (blocks + 1) * block_size * kv_bytes_per_token(ModelConfig.from_path(path), 1, torch.float32) / GIB


def tokens_of(results):
    return [r.response_ids for r in results]


def test_paged_greedy_equals_transformers_with_ragged_lengths_and_tiny_blocks(model_path):
    tok = load_tokenizer(model_path)
    reqs = ragged_requests(tok)
    engine = native(model_path, max_batch_size=12, kv_block_size=4)  # prompts and answers span up to 48 blocks
    ours = engine.generate(reqs)
    reference = make_engine(RolloutConfig(engine="hf", model_path=model_path, dtype="float32")).generate(reqs)
    assert tokens_of(ours) == tokens_of(reference)
    assert [len(r.response_ids[0]) for r in ours] == MAX_NEW
    for a, b in zip(ours, reference):
        for x, y in zip(a.logprobs, b.logprobs):
            assert max(abs(p - q) for p, q in zip(x, y)) < 1e-4
    assert engine.preemptions == 0
    # one block per token, and one block for every sequence: the same tokens
    assert tokens_of(native(model_path, max_batch_size=12, kv_block_size=1).generate(reqs)) == tokens_of(reference)
    assert tokens_of(native(model_path, max_batch_size=12, kv_block_size=256).generate(reqs)) == tokens_of(reference)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_short_budget_preempts_and_every_request_completes_with_the_same_tokens(model_path, temperature):
    tok = load_tokenizer(model_path)
    reqs = ragged_requests(tok, temperature=temperature, n=2, seed=11)
    big = native(model_path, max_batch_size=12, kv_block_size=4, max_context=200)
    expected = big.generate(reqs)
    # 60 blocks of 4 tokens: one sequence of max_context 200 fits (50 blocks), all twelve (~100 blocks) do not
    small = native(model_path, max_batch_size=12, kv_block_size=4, max_context=200,
                   kv_cache_memory_gb=budget_for(model_path, 60, 4))
    assert small.cache_plan.blocks == 61
    results = small.generate(reqs)
    assert small.preemptions > 0
    assert tokens_of(results) == tokens_of(expected)
    assert [r.finish_reasons for r in results] == [r.finish_reasons for r in expected]
    assert small.decoder.cache_bytes() <= small.cache_plan.budget_bytes
    assert big.preemptions == 0


def test_a_budget_too_small_for_one_sequence_fails_at_start_naming_the_key(model_path):
    with pytest.raises(ValueError, match=r"raise rollout\.kv_cache_memory_gb") as err:
        native(model_path, kv_block_size=16, max_context=256, kv_cache_memory_gb=budget_for(model_path, 15, 16))
    assert "max_context=256" in str(err.value)
    native(model_path, kv_block_size=16, max_context=256, kv_cache_memory_gb=budget_for(model_path, 16, 16))


def test_the_start_up_log_names_budget_blocks_and_tokens(model_path, caplog):
    with caplog.at_level(logging.INFO, logger="rlinf_like.workers.rollout.engines.native.engine"):
        engine = native(model_path, kv_block_size=8, max_context=256, kv_cache_memory_gb=budget_for(model_path, 40, 8))
    assert engine.cache_plan.blocks == 41
    line = next(r.getMessage() for r in caplog.records if "KV cache" in r.getMessage())
    assert "rollout.kv_cache_memory_gb=" in line and "40 blocks of 8 tokens" in line
    assert "at most 320 tokens in flight" in line


def test_the_default_budget_is_a_fraction_of_free_memory_capped_by_what_the_slots_can_use(model_path):
    engine = native(model_path, max_batch_size=4, kv_block_size=16, max_context=256)
    assert engine.cache_plan.blocks == 1 + 4 * 16  # the tiny model's budget is far more than 4 x 256 tokens
    assert "kv_cache_memory_fraction=0.1" in engine.cache_plan.source


@pytest.mark.real_model
def test_the_real_model_at_default_rollout_settings_stays_within_its_budget(real_model_path):
    rss = psutil.Process(os.getpid()).memory_info().rss
    free = psutil.virtual_memory().available
    engine = native(real_model_path)  # max_batch_size 64, max_context 8192 (the model's), 10% of free memory
    plan = engine.cache_plan
    assert plan.budget_bytes <= 0.1 * free * 1.05
    tok = load_tokenizer(real_model_path)
    reqs = [RolloutRequest(f"r{i}", tok(q).input_ids, SamplingParams(max_new_tokens=8, temperature=0.0, ignore_eos=True), 4)
            for i, q in enumerate(["What is 2+3?", "Name a colour."])]
    results = engine.generate(reqs)
    assert all(len(t) == 8 for r in results for t in r.response_ids)
    assert engine.decoder.cache_bytes() <= plan.budget_bytes
    grown = psutil.Process(os.getpid()).memory_info().rss - rss
    weights = sum(t.numel() * t.element_size() for t in engine.weights.values())
    assert grown <= weights + plan.budget_bytes + (1 << 30)  # weights, the cache and at most 1 GiB of the rest
    # the old layout (64 slots x 8192 positions) would have needed 64 x 8192 x 46 KiB ~ 24 GB
    assert plan.blocks * plan.block_size < 64 * 8192


# --- TP=2: vocabulary-parallel embedding and LM head ----------------------------------------------------

class ShapedRollout(RolloutWorker):
    def generate_all(self, requests):
        return self.engine.generate(requests)

    def shapes(self):
        return {name: tuple(t.shape) for name, t in self.engine.weights.items()}

    def tensor(self, name):
        return self.engine.weights[name].clone()

    def prefix_hits(self):
        return self.engine.prefix_hit_tokens


class HFActor(Worker):
    """Holds a checkpoint whole (one rank) and publishes it."""

    def __init__(self, path):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path)
        self.tensors = {n: t.detach() for n, t in model.state_dict().items() if n != "lm_head.weight"
                        or not model.config.tie_word_embeddings}

    def layouts(self):
        from rlinf_like.hybrid_engines.reshard.layout import replicated

        return [replicated(n, tuple(t.shape), 1, str(t.dtype)) for n, t in self.tensors.items()]

    def connect(self, plan):
        from rlinf_like.hybrid_engines.reshard import WeightSender

        self.sender = WeightSender(self.peer_group("weights"), plan, self.rank)

    def publish(self, version):
        return self.sender.publish(version, self.tensors)


# a tied head with q/k/v and o_proj biases (o_proj's is row parallel: replicated, added once after the all-reduce);
# Gemma 3 with an untied head (tied, a random Gemma repeats its input: both seeds would give the same tokens)
TP2_VARIANTS = {"llama-tied-attention-bias": dict(arch="llama", tie_word_embeddings=True, attention_bias=True),
                "gemma3": dict(arch="gemma3")}


@pytest.mark.parametrize("variant", TP2_VARIANTS)
def test_tp2_splits_embedding_and_lm_head_by_vocabulary_and_syncs_only_each_shard(cluster, tmp_path, variant):
    arch = TP2_VARIANTS[variant]
    tied = arch.get("tie_word_embeddings", False)
    path_a = str(write_tiny_model(tmp_path / "a", TinyModelSpec(seed=0, **arch)))
    path_b = str(write_tiny_model(tmp_path / "b", TinyModelSpec(seed=1, **arch)))
    cfg = ModelConfig.from_path(path_a)
    vocab, hidden = cfg.vocab_size, cfg.hidden_size
    tok = load_tokenizer(path_a)
    reqs = ragged_requests(tok, n=1)[:4]
    single_a = native(path_a, max_batch_size=8, kv_block_size=4).generate(reqs)
    single_b = native(path_b, max_batch_size=8, kv_block_size=4).generate(reqs)
    assert tokens_of(single_a) != tokens_of(single_b)

    placement = cluster.place({"actor": "0", "rollout": "0-1"})
    config = RolloutConfig(dtype="float32", model_path=path_a, max_batch_size=8, kv_block_size=4, tp_size=2)
    rollout = ShapedRollout.create_group(config).launch(cluster, placement, "rollout")
    actor = HFActor.create_group(path_b).launch(cluster, placement, "actor")
    try:
        heads = ["model.embed_tokens.weight"] + ([] if tied else ["lm_head.weight"])
        shapes = rollout.shapes().wait()
        half = (vocab + 1) // 2
        for name in heads:
            assert [s[name] for s in shapes] == [(half, hidden), (vocab - half, hidden)], name
        assert tied == ("lm_head.weight" not in shapes[0])
        rank0, rank1 = rollout.generate_all(reqs).wait()
        assert tokens_of(rank0) == tokens_of(rank1) == tokens_of(single_a)
        assert rollout.prefix_hits().wait() == [0, 0]
        again, _ = rollout.generate(reqs).wait()  # the same prompts: found in the prefix cache, on both ranks alike
        hits = rollout.prefix_hits().wait()
        assert hits[0] == hits[1] == sum((len(r.prompt_ids) - 1) // 4 * 4 for r in reqs) > 0
        assert tokens_of(again) == tokens_of(single_a)

        connect_groups(actor, rollout, "weights")
        [src] = actor.on_ranks(0).layouts().wait()
        [dst] = rollout.on_ranks(0).weight_layouts().wait()
        plan = SyncPlan.build(src, dst, "actor", "rollout", bucket_bytes=64 << 10)
        for name in heads:  # each rank is sent its own rows only, once
            for rank, rows in enumerate([half, vocab - half]):
                sent = sum(t.nbytes for b in plan.buckets for t in b.transfers
                           if t.dst_rank == rank and t.dst_name == name)
                assert sent == rows * hidden * 4, (name, rank)
        wait_all([actor.connect(plan), rollout.connect_weights("weights", plan)])
        wait_all([actor.publish(1), rollout.apply_weights(1)], timeout=120)
        from transformers import AutoModelForCausalLM

        whole = AutoModelForCausalLM.from_pretrained(path_b).state_dict()["model.embed_tokens.weight"]
        got = rollout.tensor("model.embed_tokens.weight").wait()
        assert torch.equal(got[0], whole[:half]) and torch.equal(got[1], whole[half:])
        after, _ = rollout.generate(reqs).wait()
        assert tokens_of(after) == tokens_of(single_b)
        assert rollout.prefix_hits().wait() == hits  # the new weights recomputed every prompt
    finally:
        rollout.shutdown()
        actor.shutdown()


def test_tp3_on_a_model_shaped_like_smollm2_serves_the_single_engine_tokens(cluster, tmp_path):
    """SmolLM2 has 9 attention heads and 3 key/value heads, so TP=3 (3 heads and 1 KV head per rank, a third of
    the vocabulary each) is its largest TP; it must serve the tokens one engine serves."""
    spec = TinyModelSpec(arch="llama", hidden_size=72, num_heads=9, num_kv_heads=3, intermediate_size=96,
                         tie_word_embeddings=True)
    path = str(write_tiny_model(tmp_path / "m", spec))
    reqs = ragged_requests(load_tokenizer(path), n=2)[:4]
    single = native(path, max_batch_size=8, kv_block_size=4).generate(reqs)
    placement = cluster.place({"rollout_tp3": "0*3"})
    config = RolloutConfig(dtype="float32", model_path=path, max_batch_size=8, kv_block_size=4, tp_size=3)
    rollout = ShapedRollout.create_group(config).launch(cluster, placement, "rollout_tp3")
    try:
        shapes = rollout.shapes().wait()
        assert [s["model.layers.0.self_attn.k_proj.weight"][0] for s in shapes] == [8, 8, 8]  # one KV head each
        for ranked in rollout.generate_all(reqs).wait():
            assert tokens_of(ranked) == tokens_of(single)
            for a, b in zip(ranked, single):
                assert max(abs(p - q) for x, y in zip(a.logprobs, b.logprobs) for p, q in zip(x, y)) < 1e-4
    finally:
        rollout.shutdown()
