"""The native engine's decode on static buffers (native/graphs.py), the shapes a CUDA graph holds: padded batch
and span buckets give the tokens of the dynamic step. On CPU it runs eagerly through the same buffers; the graphs
themselves are checked on a GPU."""

import time

import pytest
import torch

from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine
from rlinf_like.workers.rollout.engines.native import graphs
from rlinf_like.workers.rollout.engines.native.graphs import StaticDecode, batch_bucket, span_bucket

MAX_NEW = [30, 3, 21, 40, 9, 26]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("static"), TinyModelSpec(arch="llama")))


def requests(temperature):
    gen = torch.Generator().manual_seed(0)
    return [RolloutRequest(f"r{i}", torch.randint(4, 100, (5 + 7 * i,), generator=gen).tolist(),
                           SamplingParams(max_new_tokens=m, temperature=temperature, ignore_eos=True, seed=i), 2)
            for i, m in enumerate(MAX_NEW)]


def engine(path, device="cpu", **kw):
    return make_engine(RolloutConfig(engine="native", model_path=path, max_batch_size=8, kv_block_size=4,
                                     max_context=128, dtype="float32", **kw), device=device)


def test_buckets():
    assert [batch_bucket(n) for n in (1, 3, 8, 9, 200)] == [1, 4, 8, 16, 256]
    with pytest.raises(ValueError, match="exceed the largest decode bucket"):
        batch_bucket(10_000)
    assert [span_bucket(n, 4096) for n in (1, 256, 257, 3000)] == [256, 256, 512, 4096]
    assert span_bucket(300, 300) == 300


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_buffers_give_the_dynamic_steps_tokens(model_path, monkeypatch, temperature):
    """12 samples through 8 slots: the batch shrinks and refills (buckets 8, 4, 2, 1), and spans cross buckets."""
    monkeypatch.setattr(graphs, "MIN_SPAN", 16)
    dynamic = engine(model_path).generate(requests(temperature))
    static = engine(model_path)
    static.static = StaticDecode(static.decoder, static.max_blocks, static.max_context, static.device,
                                 use_graphs=False)
    seen = []
    call = StaticDecode.__call__
    monkeypatch.setattr(StaticDecode, "__call__", lambda self, *a: seen.append((a[0].shape[0], a[3])) or call(self, *a))
    padded = static.generate(requests(temperature))
    assert [r.response_ids for r in padded] == [r.response_ids for r in dynamic]
    for a, b in zip(padded, dynamic):
        for x, y in zip(a.logprobs, b.logprobs):
            assert max(abs(p - q) for p, q in zip(x, y)) < 1e-4
    assert {batch_bucket(b) for b, _ in seen} >= {8, 4, 2} and len({span_bucket(s, 128) for _, s in seen}) >= 3
    # every bucket was built when the cache was allocated (warm), and only those were used
    assert set(static.static.steps) == set(static.static.buckets(8)) >= {(batch_bucket(b), span_bucket(s, 128))
                                                                         for b, s in seen}


@pytest.mark.gpu
def test_cuda_graphs_are_captured_at_start_up_and_replay_the_eager_tokens(model_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    eager = engine(model_path, "cuda").generate(requests(1.0))
    started = time.perf_counter()
    captured = engine(model_path, "cuda", cuda_graphs=True)
    assert len(captured.static.steps) == len(captured.static.buckets(8)) and all(
        s.graph is not None for s in captured.static.steps.values())
    start_up = time.perf_counter() - started
    first = time.perf_counter()
    replayed = captured.generate(requests(1.0))
    assert time.perf_counter() - first < max(2.0, start_up)
    assert [r.response_ids for r in replayed] == [r.response_ids for r in eager]
