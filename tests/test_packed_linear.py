"""The native decode's packed linear layers (MKL's packed GEMM in float32, oneDNN's prepacked matmul in bfloat16, on
CPU): the bits of F.linear, fresh after the weights change in place (a weight sync) or move (an onload), plain
F.linear where packing is not used."""

import pytest
import torch
import torch.nn.functional as F

from rlinf_like.workers.rollout.engines.native.packed import MIN_ROWS, PACK_AFTER, PackedWeights, available

needs_mkl = pytest.mark.skipif(not available(torch.zeros(1)), reason="no MKL packed GEMM in this torch build")
DTYPES = [pytest.param(torch.float32, marks=needs_mkl),
          pytest.param(torch.bfloat16, marks=pytest.mark.skipif(not available(torch.zeros(1, dtype=torch.bfloat16)),
                                                                  reason="no oneDNN bf16 matmul on this CPU"))]


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_products_equal_f_linear_and_follow_weight_writes(dtype):
    gen = torch.Generator().manual_seed(0)
    packed = PackedWeights()
    weights = {"qkv": torch.randn(960, 576, generator=gen).to(dtype),
               "head": torch.randn(4096, 576, generator=gen).to(dtype)}
    for rows in (MIN_ROWS, 64, 128, 3):
        with packed.enabled(rows):
            # a weight is packed at its PACK_AFTER-th product, whose shape's first call checks the bits
            for _ in range(PACK_AFTER + 1):
                for name, w in weights.items():
                    x = torch.randn(rows, 1, 576, generator=gen).to(dtype)
                    assert torch.equal(packed.linear(x, name, w), F.linear(x, w)), (name, rows)
    assert set(packed._packs) == set(weights) and all(packed._same_bits.values())
    with packed.enabled(128):
        weights["qkv"][:320].mul_(-2.0)  # a sync writes a view of the fused tensor in place
        moved = weights["head"].clone()  # an onload puts the weight in new storage
        moved[7] = 3.0
        for name, w in (("qkv", weights["qkv"]), ("head", moved)):
            assert packed._packs[name][2] is not None
            for call in range(PACK_AFTER):
                x = torch.randn(128, 576, generator=gen).to(dtype)
                assert torch.equal(packed.linear(x, name, w), F.linear(x, w)), (name, call)
                assert (name in packed._packs) == (call == PACK_AFTER - 1)  # the stale copy freed, then a new one
            assert packed._packs[name][:2] == (w.data_ptr(), w._version)


def test_bias_small_batches_and_other_dtypes_take_f_linear():
    packed = PackedWeights()
    w, b = torch.randn(64, 32), torch.randn(64)
    with packed.enabled(128):
        x = torch.randn(128, 32)
        assert torch.equal(packed.linear(x, "b", w, b), F.linear(x, w, b))
        assert torch.equal(packed.linear(x.double(), "d", w.double()), F.linear(x.double(), w.double()))
    with packed.enabled(MIN_ROWS - 1):
        packed.linear(torch.randn(MIN_ROWS - 1, 32), "w", w)
    assert not packed._packs


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch build")
def test_fp32_onednn_kernels_are_close_to_f_linear_and_decode_the_exact_paths_greedy_tokens(tmp_path):
    """rollout.fp32_kernels=onednn: no bit check (its sums run in another order), fp32 rounding of F.linear's
    products, and the engine decodes the tokens of the exact path with logprobs within the fp32 contract's 1e-4."""
    from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
    from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine

    gen = torch.Generator().manual_seed(0)
    packed = PackedWeights(fp32_onednn=True)
    w = torch.randn(960, 576, generator=gen)
    for rows in (1, 3, 128):
        with packed.enabled(rows):
            for _ in range(PACK_AFTER):
                x = torch.randn(rows, 1, 576, generator=gen)
                torch.testing.assert_close(packed.linear(x, "w", w), F.linear(x, w), rtol=1e-5, atol=1e-4)
    assert "w" in packed._packs and not packed._same_bits  # used without the bit check
    path = str(write_tiny_model(tmp_path, TinyModelSpec(arch="llama", hidden_size=128, num_layers=2)))
    params = SamplingParams(max_new_tokens=3 * PACK_AFTER, ignore_eos=True)  # most steps on packed weights
    reqs = [RolloutRequest(f"r{i}", list(range(5, 9 + 3 * i)), params, 1) for i in range(6)]
    runs = {k: make_engine(RolloutConfig(engine="native", model_path=path, dtype="float32", fp32_kernels=k,
                                         max_batch_size=8)).generate(reqs) for k in ("exact", "onednn")}
    for a, b in zip(runs["exact"], runs["onednn"]):
        assert a.response_ids == b.response_ids
        assert max(abs(p - q) for p, q in zip(a.logprobs[0], b.logprobs[0])) < 1e-4
