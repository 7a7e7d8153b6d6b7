"""The native decode's packed linear layers (MKL's packed GEMM in float32, oneDNN's prepacked matmul in bfloat16, on
CPU): the bits of F.linear, fresh after the weights change in place (a weight sync) or move (an onload), plain
F.linear where packing is not used."""

import pytest
import torch
import torch.nn.functional as F

from rlinf_like.workers.rollout.native.packed import MIN_ROWS, PackedWeights, available

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
            for _ in range(2):  # the first call of a shape checks the bits, the second uses the packed weight
                for name, w in weights.items():
                    x = torch.randn(rows, 1, 576, generator=gen).to(dtype)
                    assert torch.equal(packed.linear(x, name, w), F.linear(x, w)), (name, rows)
    assert packed._packs and all(packed._same_bits.values())
    with packed.enabled(128):
        x = torch.randn(128, 576, generator=gen).to(dtype)
        weights["qkv"][:320].mul_(-2.0)  # a sync writes a view of the fused tensor in place
        assert torch.equal(packed.linear(x, "qkv", weights["qkv"]), F.linear(x, weights["qkv"]))
        moved = weights["head"].clone()  # an onload puts the weight in new storage
        moved[7] = 3.0
        assert torch.equal(packed.linear(x, "head", moved), F.linear(x, moved))


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
