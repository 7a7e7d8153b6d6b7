"""bench/rollout.py's fairness checks on a tiny model: no timed call of the native engine may find prompts in its
prefix cache (transformers prefills every call), every repetition gets prompts of its own, and the transformers
baseline is `generate` called plainly (no logits kept) making every token asked for."""

import pytest
import torch

from bench import rollout
from bench.common import assert_cold, cold_prefix_cache, seed_for, step_seconds
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model

SPEC = TinyModelSpec(hidden_size=64, num_layers=2, max_position_embeddings=256)
VOCAB = 64  # prompt ids are drawn below it: within the tiny model's vocabulary


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("tiny"), SPEC))


@pytest.fixture(scope="module")
def native(model):
    torch.set_num_threads(1)
    return rollout.NativeSide(model, "float32", "cpu", slots=8, context=rollout.MAX_PROMPT + 8)


def requests(seed: int, new_tokens: int = 4):
    return rollout.requests_for(VOCAB, 2, 2, new_tokens, seed)


def test_guard_raises_when_the_prefix_cache_is_warm(native):
    engine = native.engine
    engine.generate(requests(0))  # finished prompts stay in the prefix cache (the engine's default)
    assert engine._pool.cached > 0
    with pytest.raises(AssertionError, match="prefix cache warm"):
        assert_cold(engine)
    engine.reset_prefix_cache()
    assert_cold(engine)


def test_the_bench_times_every_native_call_cold(native):
    engine = native.engine
    engine.generate(requests(0))  # a warm-up, or the last repetition, leaves its prompts cached
    hits = engine.prefix_hit_tokens
    seconds, tokens = native.run(requests(0))  # the same prompts again: found in the cache, were it kept
    assert tokens == 2 * 2 * 4 and seconds > 0
    assert engine.prefix_hit_tokens == hits
    assert engine._pool.cached > 0  # the timed call's own prompts, emptied before the next one
    native.run(requests(0))
    assert engine.prefix_hit_tokens == hits


def test_guard_catches_prefix_hits_during_a_timed_call(native):
    engine = native.engine
    with pytest.raises(AssertionError, match="from the prefix cache"):
        with cold_prefix_cache(engine):
            engine.generate(requests(1))
            engine.generate(requests(1))  # a repeat inside the timed call finds the first one's blocks


def test_each_timed_call_gets_prompts_of_its_own():
    calls = [seed_for(0, -1)] + [seed_for(kind, rep) for kind in (0, 1, 32, 128, 256) for rep in range(5)]
    assert len(set(calls)) == len(calls)
    prompts = [tuple(map(tuple, (r.prompt_ids for r in requests(s)))) for s in (seed_for(0, 0), seed_for(0, 1))]
    assert prompts[0] != prompts[1]
    same = rollout.requests_for(VOCAB, 2, 1, 1, seed_for(0, 0))  # a step timing's 1-token call: same prompts
    assert [r.prompt_ids for r in same] == [r.prompt_ids for r in requests(seed_for(0, 0))]
    assert all(rollout.MIN_PROMPT <= len(r.prompt_ids) < rollout.MAX_PROMPT for r in requests(3))


def test_hf_baseline_is_plain_generate(model, monkeypatch):
    hf = rollout.HFGenerate(rollout.load_hf_model(model, "float32", "cpu"), "eager", rollout.MAX_PROMPT + 8, "cpu")
    seen = {}
    generate = hf.model.generate

    def spy(**kwargs):
        seen.update(kwargs)
        return generate(**kwargs)

    monkeypatch.setattr(hf.model, "generate", spy)
    seconds, tokens = hf.run(requests(seed_for(0, 0), new_tokens=5))
    assert tokens == 2 * 2 * 5 and seconds > 0
    assert not {"output_logits", "output_scores", "return_dict_in_generate"} & set(seen)
    assert (seen["do_sample"], seen["temperature"], seen["top_k"], seen["top_p"]) == (True, 1.0, 0, 1.0)
    assert seen["min_new_tokens"] == seen["max_new_tokens"] == 5 and seen["pad_token_id"] is not None
    assert seen["attention_mask"][:, -1].all()  # left padding


def test_step_time_and_ratios():
    assert step_seconds(3.0, 1.0, 5) == 0.5
    rates = rollout.summary({"native": [10.0, 12.0, 11.0], "hf_eager": [5.0, 6.0, 4.0],
                             "hf_static_compile": [8.0, 8.0, 9.0]}, higher_is_better=True)
    assert rates["baseline"] == "hf_static_compile" and rates["ratio"] == 11.0 / 8.0
    assert rates["ratios"] == [10 / 8, 12 / 8, 11 / 9]
    steps = rollout.summary({"native": [2.0, 2.0, 2.0], "hf_eager": [3.0, 4.0, 5.0]})
    assert steps["baseline"] == "hf_eager" and steps["ratio"] == 2.0 and steps["ratios"] == [1.5, 2.0, 2.5]
