"""Rollout engines in one process: the native engine against transformers' generate, and its
batching, sampling, memory and error behaviour."""

import threading
import time

import pytest

from rlinf_like.models import load_tokenizer
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.workers.rollout import (
    RolloutConfig,
    RolloutRequest,
    RolloutResult,
    SamplingParams,
    continuation,
    make_engine,
)

PROMPTS = ["12+34=", "hello world, this is", "a", "The quick brown fox jumps over", "x*y", "Q: 7-2? A:"]
GREEDY = SamplingParams(max_new_tokens=40, temperature=0.0)


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model_path(request, tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp(request.param), TinyModelSpec(arch=request.param)))


@pytest.fixture(scope="module")
def engines(model_path):
    return (make_engine(RolloutConfig(dtype="float32", engine="native", model_path=model_path, max_batch_size=16)),
            make_engine(RolloutConfig(dtype="float32", engine="hf", model_path=model_path)), load_tokenizer(model_path))


def requests(tokenizer, params=GREEDY, n=1, prompts=PROMPTS):
    return [RolloutRequest(f"r{i}", tokenizer(p).input_ids, params, n) for i, p in enumerate(prompts)]


def assert_same_greedy(ours, reference):
    for a, b in zip(ours, reference):
        assert a.response_ids == b.response_ids, a.request_id
        assert a.finish_reasons == b.finish_reasons, a.request_id
        for x, y in zip(a.logprobs, b.logprobs):
            assert max(abs(p - q) for p, q in zip(x, y)) < 1e-4


def test_greedy_matches_transformers_on_ragged_prompts(engines):
    native, hf, tok = engines
    ours, reference = native.generate(requests(tok)), hf.generate(requests(tok))
    assert_same_greedy(ours, reference)
    reasons = {r for res in ours for r in res.finish_reasons}
    assert reasons == {"stop", "length"}  # both EOS and the length limit occur in this set
    assert all(len(r.response_ids[0]) == len(r.logprobs[0]) > 0 for r in ours)


def test_stop_tokens_and_stop_strings_match_transformers(engines):
    native, hf, tok = engines
    # stop at the most common character of the greedy outputs, and at a two-character string of one of them
    text = "".join(tok.decode(r.response_ids[0]) for r in native.generate(requests(tok)))
    common = max(set(text), key=text.count)
    params = SamplingParams(max_new_tokens=40, temperature=0.0, stop_token_ids=(tok.convert_tokens_to_ids(common),))
    ours = native.generate(requests(tok, params))
    assert_same_greedy(ours, hf.generate(requests(tok, params)))
    assert sum(r.finish_reasons[0] == "stop" for r in ours) >= 3
    longest = max(native.generate(requests(tok)), key=lambda r: len(r.response_ids[0])).response_ids[0]
    pair = tok.decode(longest[5:7])  # occurs in that response, so it must stop there (or earlier)
    params = SamplingParams(max_new_tokens=40, temperature=0.0, stop_strings=(pair,))
    ours = native.generate(requests(tok, params))
    assert_same_greedy(ours, hf.generate(requests(tok, params)))
    assert any(r.finish_reasons[0] == "stop" and tok.decode(r.response_ids[0]).endswith(pair) for r in ours)


def test_continuous_batching_with_few_slots_gives_the_same_results(model_path, engines):
    native, _, tok = engines
    small = make_engine(RolloutConfig(dtype="float32", engine="native", model_path=model_path, max_batch_size=3))
    reqs = requests(tok, n=2) + requests(tok, SamplingParams(max_new_tokens=7, temperature=0.0))
    many = native.generate(reqs)
    few = small.generate(reqs)  # 3 slots for 24 sequences: slots are refilled as sequences finish
    assert [r.response_ids for r in few] == [r.response_ids for r in many]
    assert [len(t) for t in few[-1].response_ids] == [7]


def test_sampling_is_reproducible_and_samples_differ(engines):
    native, _, tok = engines
    params = SamplingParams(max_new_tokens=20, temperature=1.0, top_k=30, top_p=0.95, seed=7)
    alone = native.generate(requests(tok, params, n=4, prompts=["abc"]))[0]
    mixed = native.generate(requests(tok, GREEDY) + requests(tok, params, n=4, prompts=["abc"]))[-1]
    assert alone.response_ids == mixed.response_ids  # independent of what else is in the batch
    assert len({tuple(t) for t in alone.response_ids}) == 4
    other = native.generate(requests(tok, SamplingParams(max_new_tokens=20, temperature=1.0, seed=8), n=4,
                                     prompts=["abc"]))[0]
    assert other.response_ids != alone.response_ids


def test_offload_then_onload_gives_identical_outputs(engines):
    native, _, tok = engines
    params = SamplingParams(max_new_tokens=16, temperature=0.8, seed=1)
    before = native.generate(requests(tok, params, n=2))
    native.offload()
    assert native._residency.device_bytes("params") == 0 and native.decoder.k_cache is None
    with pytest.raises(RuntimeError, match="onload"):
        native.generate(requests(tok))
    native.onload()
    after = native.generate(requests(tok, params, n=2))
    assert [r.response_ids for r in after] == [r.response_ids for r in before]
    assert [r.logprobs for r in after] == [r.logprobs for r in before]


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_bad_requests_are_named_and_the_rest_is_served(engines, engine):
    native, hf, tok = engines
    eng = native if engine == "native" else hf
    good = requests(tok, prompts=["12+34=", "abc"])
    bad = [RolloutRequest("empty", [], GREEDY), RolloutRequest("zero", [5], SamplingParams(max_new_tokens=0)),
           RolloutRequest("long", [5] * 300, GREEDY)]
    results = eng.generate([bad[0], good[0], bad[1], bad[2], good[1]])
    errors = {r.request_id: r.error for r in results if not r.ok}
    assert "empty prompt" in errors["empty"] and "'empty'" in errors["empty"]
    assert "max_new_tokens" in errors["zero"] and "'zero'" in errors["zero"]
    assert "does not fit the context of 256" in errors["long"]
    served = [r for r in results if r.ok]
    assert [r.response_ids for r in served] == [r.response_ids for r in eng.generate(good)]


def test_abort_returns_partial_prefixes(engines):
    native, _, tok = engines
    long = SamplingParams(max_new_tokens=200, temperature=0.0, ignore_eos=True)
    full = native.generate(requests(tok, long, prompts=["abc"]))[0].response_ids[0]
    streamed = []
    timer = threading.Timer(0.3, native.abort)
    timer.start()
    start = time.perf_counter()
    results = native.generate(requests(tok, long, n=2, prompts=["abc"] * 20), on_result=streamed.append)
    timer.join()
    assert time.perf_counter() - start < 10
    reasons = [r for res in results for r in res.finish_reasons]
    assert "abort" in reasons
    for res in results:
        for tokens, reason in zip(res.response_ids, res.finish_reasons):
            assert tokens == full[: len(tokens)]  # partial, but a true prefix
            assert (reason == "length") == (len(tokens) == 200)
    assert len(streamed) == len(results)  # every group was reported, aborted ones too
    assert native.generate(requests(tok, long, prompts=["abc"]))[0].response_ids[0] == full  # abort was cleared


def test_migrated_samples_continue_with_the_tokens_they_would_have_drawn(model_path, engines):
    """A request stopped part-way (every sample at a different point, one already done) and continued
    on another engine, in another batch, draws exactly the tokens of an uninterrupted run."""
    native, hf, tok = engines
    params = SamplingParams(max_new_tokens=24, temperature=1.0, top_k=40, seed=11)
    [full] = native.generate(requests(tok, params, n=4, prompts=["7+8="]))
    cut = [0, 1, len(full.response_ids[2]) // 2, len(full.response_ids[3])]  # not started ... finished
    partial = RolloutResult(full.request_id, full.prompt_ids, [t[:k] for t, k in zip(full.response_ids, cut)],
                            [lp[:k] for lp, k in zip(full.logprobs, cut)],
                            ["abort", "abort", "abort", full.finish_reasons[3]])
    moved = continuation(requests(tok, params, n=4, prompts=["7+8="])[0], partial)
    assert moved.unfinished() == [0, 1, 2]
    other = make_engine(RolloutConfig(dtype="float32", engine="native", model_path=model_path, max_batch_size=5))
    resumed = other.generate(requests(tok, GREEDY, prompts=["a", "xyz"]) + [moved])[-1]
    assert resumed.response_ids == full.response_ids
    assert resumed.finish_reasons == full.finish_reasons
    for got, want, k in zip(resumed.logprobs, full.logprobs, cut):
        assert got[:k] == want[:k]  # what was generated before the move is kept as it was
        assert max(abs(a - b) for a, b in zip(got, want)) < 1e-4  # the rest: another batch, other roundings
    # a continuation needs a seed to draw the same noise, and only engines that can continue accept one
    unseeded = continuation(requests(tok, SamplingParams(temperature=1.0), n=4, prompts=["7+8="])[0], partial)
    assert "needs sampling.seed" in other.generate([unseeded])[0].error
    assert "cannot continue a migrated request" in hf.generate([moved])[0].error


def test_rescored_logprobs_do_not_depend_on_the_batch_or_a_migration(model_path, engines):
    native, _, tok = engines
    rescoring = make_engine(RolloutConfig(dtype="float32", engine="native", model_path=model_path, max_batch_size=16,
                                          logprobs="rescored"))
    params = SamplingParams(max_new_tokens=20, temperature=0.7, seed=3)
    alone = rescoring.generate(requests(tok, params, n=4, prompts=["abc"]))[0]
    mixed = rescoring.generate(requests(tok, GREEDY) + requests(tok, params, n=4, prompts=["abc"]))[-1]
    sampled = native.generate(requests(tok, params, n=4, prompts=["abc"]))[0]
    assert alone.response_ids == mixed.response_ids == sampled.response_ids
    assert alone.logprobs == mixed.logprobs  # bit for bit
    assert max(abs(a - b) for x, y in zip(alone.logprobs, sampled.logprobs) for a, b in zip(x, y)) < 1e-4
    # stopped when a short request ends (two tokens in), then continued elsewhere: the same floats again
    short = [RolloutRequest("short", tok("hi").input_ids, SamplingParams(max_new_tokens=2, temperature=0.0))]
    stopped = rescoring.generate(short + requests(tok, params, n=4, prompts=["abc"]),
                                 on_result=lambda result: rescoring.abort())[-1]
    assert stopped.partial and all(len(t) <= 3 for t in stopped.response_ids)
    moved = continuation(requests(tok, params, n=4, prompts=["abc"])[0], stopped)
    assert rescoring.generate(requests(tok, GREEDY, prompts=["zz"]) + [moved])[-1].logprobs == alone.logprobs
    with pytest.raises(ValueError, match="rollout.logprobs=rescored is built into the native engine only"):
        make_engine(RolloutConfig(dtype="float32", engine="hf", model_path=model_path, logprobs="rescored"))
