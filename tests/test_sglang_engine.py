"""The SGLang rollout engine: a clear error without the [sglang] extra, rollout.tp_size reaching sglang.Engine's
tp_size and a TP replica's weight layouts (CPU); on a GPU the same greedy tokens and logprobs as transformers'
generate, lossless offload/onload, per-request errors, a weight sync (also while offloaded), abort, and TP=2."""

import sys
import threading
import time

import pytest
import torch

from rlinf_like.models import load_tokenizer
from rlinf_like.models.tiny import write_tiny_model
from rlinf_like.utils.extras import MissingExtraError
from rlinf_like.hybrid_engines.reshard import apply_in_process, plan_reshard, sharded
from rlinf_like.models.tiny import TinyModelSpec
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine
from rlinf_like.workers.rollout.engine import check_rollout_config
from rlinf_like.workers.rollout.engines.sglang_tp import SGLangFollower, engine_kwargs, sglang_layouts

PROMPTS = ["12+34=", "hello world, this is", "a", "The quick brown fox jumps over", "x*y", "Q: 7-2? A:"]
GREEDY = SamplingParams(max_new_tokens=40, temperature=0.0)


def test_sglang_engine_without_the_extra_names_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "sglang", None)  # fails like a missing package, even where it is installed
    with pytest.raises(MissingExtraError, match=r"\[sglang\]"):
        make_engine(RolloutConfig(engine="sglang", model_path=str(tmp_path)))


def test_rollout_tp_size_reaches_sglang_engine_kwargs():
    config = RolloutConfig(engine="sglang", model_path="m", tp_size=2, max_context=96, sglang_mem_fraction=0.4)
    kwargs = engine_kwargs(config)
    assert kwargs["tp_size"] == 2 and kwargs["base_gpu_id"] == 0
    assert (kwargs["model_path"], kwargs["context_length"], kwargs["mem_fraction_static"]) == ("m", 96, 0.4)
    assert engine_kwargs(config, tp_size=4)["tp_size"] == 4  # the replica's ranks, as the worker resolved them
    assert engine_kwargs(RolloutConfig(engine="sglang", model_path="m"))["tp_size"] == 1  # 0: one GPU standalone
    assert "context_length" not in engine_kwargs(RolloutConfig(engine="sglang", model_path="m"))
    assert engine_kwargs(config, attention_backend="torch_native")["attention_backend"] == "torch_native"
    assert check_rollout_config(config, 2).supports_tp  # accepted by key; the hf engine is refused
    with pytest.raises(ValueError, match="tensor parallelism needs rollout.engine in"):
        check_rollout_config(RolloutConfig(engine="hf", model_path="m"), 2)


def test_tp_replica_weights_go_whole_to_its_first_rank_and_nothing_to_the_others():
    shapes = {"w": (6, 4), "b": (6,)}
    targets = sglang_layouts(shapes, torch.float32, 2)
    sources = [sharded(name, shape, 2, 0) for name, shape in shapes.items()]  # an FSDP-like actor, dp=2
    transfers = plan_reshard(sources, targets)
    assert {t.dst_rank for t in transfers} == {0}
    full = {name: torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
            for name, shape in shapes.items()}
    src = {r: {name: full[name][3 * r:3 * r + 3] for name in shapes} for r in (0, 1)}
    leader = {name: torch.zeros(shape) for name, shape in shapes.items()}
    follower = SGLangFollower(shapes, torch.float32, tp_size=2, tp_rank=1)
    assert all(t.numel() == 0 for t in follower.weight_tensors().values())
    apply_in_process(transfers, src, {0: leader, 1: follower.weight_tensors()})
    assert all(torch.equal(leader[name], full[name]) for name in shapes)
    assert follower.generate([RolloutRequest("r", [1, 2], GREEDY)]) == []  # the first rank serves the replica


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    pytest.importorskip("sglang")
    from rlinf_like.workers.rollout.engines.hf_engine import HFEngine
    from rlinf_like.workers.rollout.engines.sglang_engine import SGLangEngine

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


@pytest.mark.gpu
def test_weight_sync_into_sglang_serves_the_new_weights_also_when_offloaded(engines, tmp_path):
    pytest.importorskip("sglang")
    from safetensors.torch import load_file

    from rlinf_like.workers.rollout.engines.hf_engine import HFEngine

    sglang, hf, tok = engines
    other = write_tiny_model(tmp_path / "other", TinyModelSpec(seed=1))  # same shapes, other weights
    new, old = load_file(str(other / "model.safetensors")), {n: t.clone() for n, t in sglang.weight_tensors().items()}
    reference = HFEngine(RolloutConfig(engine="hf", model_path=str(other), dtype="float32")).generate(requests(tok))
    before = sglang.generate(requests(tok))
    assert [r.response_ids for r in before] != [r.response_ids for r in reference]  # the sync has to change them
    try:
        for name, tensor in sglang.weight_tensors().items():  # what a WeightReceiver round writes
            tensor.copy_(new[name])
        sglang._weights_changed()
        assert [r.response_ids for r in sglang.generate(requests(tok))] == [r.response_ids for r in reference]
        sglang.offload()  # a sync that arrives while offloaded goes in at onload
        for name, tensor in sglang.weight_tensors().items():
            tensor.copy_(old[name])
        sglang._weights_changed()
        sglang.onload()
        assert [r.response_ids for r in sglang.generate(requests(tok))] == [r.response_ids for r in before]
    finally:
        for name, tensor in sglang.weight_tensors().items():  # the module's other tests expect the first model
            tensor.copy_(old[name])
        sglang._weights_changed()


@pytest.mark.gpu
def test_abort_returns_partial_samples_that_another_generate_finishes(engines):
    pytest.importorskip("sglang")
    from rlinf_like.workers.rollout import continuation

    sglang, _, tok = engines
    long = SamplingParams(max_new_tokens=240, temperature=0.0, ignore_eos=True)
    reqs = requests(tok, long, prompts=["12+34=", "abc"])
    out: list = []
    worker = threading.Thread(target=lambda: out.extend(sglang.generate(reqs)))
    worker.start()
    time.sleep(0.3)
    sglang.abort()
    worker.join(timeout=60)
    assert not worker.is_alive() and len(out) == 2
    assert any(r == "abort" for res in out for r in res.finish_reasons)
    for res in out:
        for tokens, logprobs, reason in zip(res.response_ids, res.logprobs, res.finish_reasons):
            assert len(tokens) == len(logprobs) and (reason == "abort") == (len(tokens) < 240)
    finished = sglang.generate([continuation(q, r) for q, r in zip(reqs, out)])  # the abort does not stick
    assert all(len(t) == 240 and reason == "length" for res in finished
               for t, reason in zip(res.response_ids, res.finish_reasons))
    assert [res.response_ids for res in finished] == [res.response_ids for res in sglang.generate(reqs)]  # greedy


@pytest.mark.gpu
def test_tp2_engine_matches_tp1(engines, tmp_path):
    pytest.importorskip("sglang")
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    from rlinf_like.workers.rollout.engines.sglang_engine import SGLangEngine

    sglang, _, tok = engines
    path = str(write_tiny_model(tmp_path / "tiny"))  # 4 heads, 2 kv heads: TP 2 divides both
    tp2 = SGLangEngine(RolloutConfig(engine="sglang", model_path=path, dtype="float32", sglang_mem_fraction=0.2,
                                     tp_size=2), attention_backend="torch_native", disable_cuda_graph=True)
    try:
        assert tp2.engine.server_args.tp_size == 2
        assert [r.response_ids for r in tp2.generate(requests(tok))] == \
            [r.response_ids for r in sglang.generate(requests(tok))]
    finally:
        tp2.shutdown()
