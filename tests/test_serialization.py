"""Out-of-band tensor packing used by channels: exact round trips, owned results, ObjectRef fallback."""

import pickle

import pytest
import torch

from rlinf_like.runtime.serialization import UsesRaySerializer, pack, unpack


def round_trip(obj):
    return unpack(pickle.loads(pickle.dumps(pack(obj), protocol=5)))


@pytest.mark.parametrize(
    "tensor",
    [torch.randn(3, 4), torch.randn(4, 3).t(), torch.randn(7, dtype=torch.bfloat16), torch.tensor(True),
     torch.arange(6, dtype=torch.int64).reshape(2, 3), torch.zeros(0, 5), torch.tensor(2.5, dtype=torch.float64),
     torch.randint(0, 255, (9,), dtype=torch.uint8)],
    ids=["f32", "transposed", "bf16", "bool0d", "i64", "empty", "f64-0d", "u8"],
)
def test_tensor_round_trip_is_bit_exact(tensor):
    out = round_trip({"t": tensor})["t"]
    assert out.dtype == tensor.dtype and out.shape == tensor.shape
    as_bytes = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # bit-exact, NaN-safe  # noqa: E731
    assert torch.equal(as_bytes(out), as_bytes(tensor))


def test_tensors_travel_out_of_band_and_come_back_owned():
    big = torch.randn(1 << 16)
    packed = pack({"x": big, "meta": [1, "a"]})
    assert len(packed.buffers) == 1 and packed.buffers[0].nbytes == big.numel() * 4
    assert len(packed.data) < 1024  # the bytes are not in the pickle stream
    out = unpack(packed)
    out["x"][0] = 123.0  # writable, and not aliasing the sender's tensor or the buffer
    assert big[0] != 123.0 and out["meta"] == [1, "a"]
    assert unpack(packed)["x"][0] == big[0]


def test_requires_grad_is_kept():
    w = torch.randn(3, requires_grad=True)
    out = round_trip(w)
    assert out.requires_grad and out.is_leaf and torch.equal(out.detach(), w.detach())


def test_object_refs_need_rays_serializer(cluster):
    import ray

    with pytest.raises(UsesRaySerializer):
        pack({"ref": ray.put(1)})
