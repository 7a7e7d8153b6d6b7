"""The native engine's prefix cache (rollout.prefix_cache): a turn that extends a finished one prefills only its
new tokens, with the tokens and logprobs of the engine without the cache (and of transformers); least recently
used blocks go first under block pressure, a parent taking its descendants with it; weight changes and offloads
drop the cache; the blocks a request shares are never written."""

import pytest
import torch

from rlinf_like.models.families import ModelConfig
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine
from rlinf_like.workers.rollout.engines.native.model import kv_bytes_per_token
from rlinf_like.workers.rollout.engines.native.paging import GIB
from rlinf_like.workers.rollout.engines.native.prefix_cache import CachingBlockPool

PROMPT = [5 + (7 * i) % 60 for i in range(10)]
ENV = [40, 41, 42]  # what an environment appends after a turn


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("tiny"), TinyModelSpec(arch="llama")))


def native(path, **kw):
    return make_engine(RolloutConfig(dtype="float32", engine="native", model_path=path, kv_block_size=4, max_batch_size=8, **kw))


def budget_for(path, blocks, block_size=4):
    """kv_cache_memory_gb holding exactly `blocks` usable blocks (plus the scratch block)."""
    return (blocks + 1) * block_size * kv_bytes_per_token(ModelConfig.from_path(path), 1, torch.float32) / GIB


def turn(rid, prompt, max_new, temperature=0.0, n=1, seed=None):
    params = SamplingParams(max_new_tokens=max_new, temperature=temperature, ignore_eos=True, seed=seed)
    return RolloutRequest(rid, list(prompt), params, n)


def assert_same(ours, reference, tolerance=1e-4):  # as test_paged_kv_cache against transformers
    assert [r.response_ids for r in ours] == [r.response_ids for r in reference]
    for a, b in zip(ours, reference):
        for x, y in zip(a.logprobs, b.logprobs):
            assert max(abs(p - q) for p, q in zip(x, y)) < tolerance


def test_a_turn_extending_a_finished_one_prefills_only_its_new_tokens_with_the_same_outputs(path):
    engine, plain = native(path), native(path, prefix_cache=False)
    [first] = engine.generate([turn("t0", PROMPT, 12)])
    assert (engine.prefilled_tokens, engine.prefix_hit_tokens) == (10, 0)
    trajectory = PROMPT + first.response_ids[0] + ENV  # 25 tokens
    [second] = engine.generate([turn("t1", trajectory, 9)])
    # the first turn left 10 + 12 - 1 = 21 positions in the cache: 5 full blocks of 4, so 5 tokens are new
    assert (engine.prefilled_tokens, engine.prefix_hit_tokens) == (10 + 5, 20)
    reference = plain.generate([turn("t1", trajectory, 9)])
    assert plain.prefilled_tokens == 25 and plain.prefix_hit_tokens == 0
    assert_same([second], reference)
    hf = make_engine(RolloutConfig(dtype="float32", engine="hf", model_path=path)).generate([turn("t1", trajectory, 9)])
    assert_same([second], hf)
    # a prompt the cache holds whole still computes its last token (its logits), into a block of its own
    [again] = engine.generate([turn("t2", trajectory[:24], 3)])
    assert engine.prefix_hit_tokens == 20 + 20 and engine.prefilled_tokens == 15 + 4
    assert_same([again], plain.generate([turn("t2", trajectory[:24], 3)]))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_multi_turn_groups_give_the_same_tokens_with_the_cache_on_and_off(path, temperature):
    engines = native(path), native(path, prefix_cache=False)
    prompts = [PROMPT, PROMPT[:3], PROMPT * 3, [9] * 17]
    outputs = []
    for engine in engines:
        results = []
        histories = [list(p) for p in prompts]
        for t in range(3):  # each turn's prompt: the whole trajectory of the previous one (sample 0) + the env
            batch = [turn(f"p{i}/{t}", h, 6 + 5 * i, temperature, n=3, seed=i + 10 * t)
                     for i, h in enumerate(histories)]
            results += engine.generate(batch)
            histories = [h + r.response_ids[0] + ENV for h, r in zip(histories, results[-len(batch):])]
        outputs.append(results)
    assert_same(*outputs)
    assert engines[0].prefix_hit_tokens > 0.5 * engines[0].prefilled_tokens
    assert engines[1].prefix_hit_tokens == 0


def test_the_pool_evicts_the_least_recently_used_tail_first_and_a_parent_takes_its_descendants():
    pool = CachingBlockPool(9, block_size=2, enabled=True)  # 8 usable blocks
    a = [pool.take() for _ in range(3)]
    pool.insert([1, 2, 3, 4, 5, 6, 7], a, pool.generation)  # 3 full blocks (the 7th token is in none)
    pool.release(a)
    b = [pool.take() for _ in range(3)]
    pool.insert([7, 8, 9, 10, 11, 12], b, pool.generation)
    pool.release(b)
    assert (pool.available, pool.cached, pool.in_use) == (8, 6, 0)
    assert pool.lookup([1, 2, 3, 4, 5, 6, 0], 9) == a and pool.lookup([1, 2, 3, 9], 9) == a[:1]
    assert pool.lookup([1, 2, 3, 4, 5, 6], 2) == a[:2] and pool.lookup([2, 1], 9) == []
    [pool.take() for _ in range(4)]  # the 2 free ones, then a's tail, then its middle
    assert pool.lookup([1, 2, 3, 4, 5, 6], 3) == a[:1] and pool.lookup([7, 8, 9, 10, 11, 12], 3) == b
    pool.acquire(b)  # held: not evictable
    assert pool.available == 1 and pool.idle_among(b) == 0 and pool.idle_among(a) == 1
    pool.clear()  # held blocks lose their keys and are freed when released
    assert pool.cached == 0 and pool.lookup([7, 8], 1) == []
    pool.release(b)
    assert pool.available == 4 and pool.cached == 0  # a's head (idle, freed by clear) and b

    # a head released before its tail is evicted first, and its descendants lose their keys with it
    pool = CachingBlockPool(5, block_size=2, enabled=True)
    chain = [pool.take() for _ in range(3)]
    pool.insert([7, 8, 9, 10, 11, 12], chain, pool.generation)
    pool.release(chain[:1])
    pool.release(chain[1:])
    assert pool.take() not in chain  # the free block first
    assert pool.take() in chain  # then the least recently used: the head, its two descendants freed with it
    assert pool.lookup([7, 8, 9, 10, 11, 12], 3) == [] and pool.cached == 0 and pool.available == 2
    pool.insert([7, 8], [pool.take()], pool.generation - 1)  # keys/values of older weights: not indexed
    assert pool.cached == 0
    off = CachingBlockPool(5, block_size=2, enabled=False)
    blocks = [off.take()]
    off.insert([7, 8], blocks, off.generation)
    off.release(blocks)
    assert off.cached == 0 and off.available == 4


def test_under_block_pressure_the_oldest_cached_blocks_are_evicted_and_outputs_stay_the_same(path):
    kw = dict(max_context=96, kv_cache_memory_gb=budget_for(path, 24))
    engine, plain = native(path, **kw), native(path, prefix_cache=False, **kw)
    first = turn("a", PROMPT, 20)
    [a] = engine.generate([first])  # 29 positions cached: 7 full blocks kept, 17 blocks free
    assert engine._pool.cached == 7 and engine._pool.available == 24
    long = turn("c", [3 + i % 50 for i in range(40)], 40)  # grows to 20 blocks: the 3 oldest cached ones go
    assert_same(engine.generate([long]), plain.generate([long]))
    assert engine._pool.in_use == 0 and engine._pool.available == 24
    trajectory = PROMPT + a.response_ids[0] + ENV
    hits = engine.prefix_hit_tokens
    [b] = engine.generate([turn("b", trajectory, 8)])
    assert engine.prefix_hit_tokens - hits == 4 * 4  # a's head survived, its tail (released first) did not
    assert_same([b], plain.generate([turn("b", trajectory, 8)]))
    assert engine.preemptions == plain.preemptions == 0


def test_new_weights_a_new_version_or_an_offload_drop_the_cache(path):
    engine, plain = native(path), native(path, prefix_cache=False)
    [first] = engine.generate([turn("t0", PROMPT, 12)])
    trajectory = PROMPT + first.response_ids[0] + ENV
    head = "lm_head.weight"
    for e in (engine, plain):  # written in place, as a weight sync does, the version left as it is
        e.weights[head].mul_(-1)
    hits = engine.prefix_hit_tokens
    [changed] = engine.generate([turn("t1", trajectory, 9)])
    assert engine.prefix_hit_tokens == hits  # recomputed: nothing came from the old weights' cache
    assert_same([changed], plain.generate([turn("t1", trajectory, 9)]))
    engine.generate([turn("t1", trajectory, 9)])
    assert engine.prefix_hit_tokens == hits + 24  # cached again, under the new weights
    engine.version = 7  # a new version (apply_weights sets it after writing the weights)
    engine.generate([turn("t1", trajectory, 9)])
    assert engine.prefix_hit_tokens == hits + 24
    engine.offload()
    engine.onload()
    engine.generate([turn("t1", trajectory, 9)])
    assert engine.prefix_hit_tokens == hits + 24
    engine.reset_prefix_cache()
    engine.generate([turn("t1", trajectory, 9)])
    assert engine.prefix_hit_tokens == hits + 24


def test_the_blocks_a_request_shares_are_never_written(path):
    engine = native(path)
    [first] = engine.generate([turn("t0", PROMPT, 12)])
    pool, cache = engine._pool, engine.decoder
    shared = sorted(pool._key)
    rows = torch.tensor([b * 4 + i for b in shared for i in range(4)])
    before = cache.k_cache[:, :, rows].clone(), cache.v_cache[:, :, rows].clone()
    trajectory = PROMPT + first.response_ids[0] + ENV
    # three samples of the extension, a prompt the cache holds whole (its last token is computed anew) and another
    # request, decoding past the shared blocks together
    engine.generate([turn("t1", trajectory, 20, temperature=1.0, n=3, seed=3), turn("w", trajectory[:20], 10),
                     turn("u", [60 - i for i in range(7)], 30)])
    assert engine.prefix_hit_tokens == 20 + 16 and set(shared) <= set(pool._key)
    assert torch.equal(cache.k_cache[:, :, rows], before[0]) and torch.equal(cache.v_cache[:, :, rows], before[1])
