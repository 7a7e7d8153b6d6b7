"""The SGLang rollout engine: a clear error without the [sglang] extra (CPU), and on a GPU the same
greedy tokens and logprobs as transformers' generate, lossless offload/onload, and per-request errors."""

import sys

import pytest

from rlinf_like.models import load_tokenizer
from rlinf_like.models.tiny import write_tiny_model
from rlinf_like.utils.extras import MissingExtraError
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine

PROMPTS = ["12+34=", "hello world, this is", "a", "The quick brown fox jumps over", "x*y", "Q: 7-2? A:"]
GREEDY = SamplingParams(max_new_tokens=40, temperature=0.0)


def test_sglang_engine_without_the_extra_names_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "sglang", None)  # fails like a missing package, even where it is installed
    with pytest.raises(MissingExtraError, match=r"\[sglang\]"):
        make_engine(RolloutConfig(engine="sglang", model_path=str(tmp_path)))


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    pytest.importorskip("sglang")
    from rlinf_like.workers.rollout.hf_engine import HFEngine
    from rlinf_like.workers.rollout.sglang_engine import SGLangEngine

    path = str(write_tiny_model(tmp_path_factory.mktemp("tiny")))
    config = RolloutConfig(engine="sglang", model_path=path, dtype="float32", sglang_mem_fraction=0.3)
    # fp32 end to end so logprobs can agree to 1e-3: SDPA attention (no TF32 kernels), no CUDA graphs
    sglang = SGLangEngine(config, attention_backend="torch_native", disable_cuda_graph=True)
    hf = HFEngine(RolloutConfig(engine="hf", model_path=path, dtype="float32"))
    yield sglang, hf, load_tokenizer(path)
    sglang.shutdown()


def requests(tokenizer, params=GREEDY, prompts=PROMPTS):
    return [RolloutRequest(f"r{i}", tokenizer(p).input_ids, params) for i, p in enumerate(prompts)]


@pytest.mark.gpu
def test_greedy_matches_transformers(engines):
    pytest.importorskip("sglang")
    sglang, hf, tok = engines
    ours, reference = sglang.generate(requests(tok)), hf.generate(requests(tok))
    for a, b in zip(ours, reference):
        assert a.ok and a.response_ids == b.response_ids, a.request_id
        assert a.finish_reasons == b.finish_reasons, a.request_id
        for x, y in zip(a.logprobs, b.logprobs):
            assert len(x) == len(y) and max(abs(p - q) for p, q in zip(x, y)) < 1e-3, a.request_id
    assert {r for res in ours for r in res.finish_reasons} == {"stop", "length"}


@pytest.mark.gpu
def test_offload_then_onload_gives_identical_greedy_outputs(engines):
    pytest.importorskip("sglang")
    sglang, _, tok = engines
    before = sglang.generate(requests(tok))
    sglang.offload()
    sglang.onload()
    after = sglang.generate(requests(tok))
    assert [r.response_ids for r in after] == [r.response_ids for r in before]


@pytest.mark.gpu
def test_bad_request_is_named_and_the_rest_is_served(engines):
    pytest.importorskip("sglang")
    sglang, hf, tok = engines
    good = requests(tok, prompts=["12+34=", "abc"])
    results = sglang.generate([good[0], RolloutRequest("empty", [], GREEDY), good[1]])
    assert [r.request_id for r in results] == ["r0", "empty", "r1"]  # request order kept
    assert not results[1].ok and "'empty'" in results[1].error and "empty prompt" in results[1].error
    served = [results[0], results[2]]
    assert all(r.ok for r in served)
    assert [r.response_ids for r in served] == [r.response_ids for r in hf.generate(good)]


@pytest.mark.gpu
def test_migrated_greedy_request_continues_to_the_same_tokens(engines):
    pytest.importorskip("sglang")
    from rlinf_like.workers.rollout import RolloutResult, continuation

    sglang, _, tok = engines
    [full] = sglang.generate(requests(tok, prompts=["The quick brown fox jumps over"]))
    cut = len(full.response_ids[0]) // 2
    partial = RolloutResult(full.request_id, full.prompt_ids, [full.response_ids[0][:cut]],
                            [full.logprobs[0][:cut]], ["abort"])
    [resumed] = sglang.generate([continuation(requests(tok, prompts=["The quick brown fox jumps over"])[0], partial)])
    assert resumed.response_ids == full.response_ids  # greedy: the prefix fixes the rest
    assert resumed.logprobs[0][:cut] == full.logprobs[0][:cut] and resumed.finish_reasons == full.finish_reasons
