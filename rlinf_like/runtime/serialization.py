"""Pack items holding tensors so their bytes reach the object store with one copy.

Ray pickles a torch.Tensor through torch's own reducer, which copies its bytes before they
reach the object store (and again when they are read back). Numpy arrays, in contrast, go in with
one memcpy and come out as zero-copy views. `pack` pickles an item with every CPU tensor
replaced by an out-of-band uint8 numpy buffer; `unpack` rebuilds each tensor with one copy out
of the (read-only, shared) store memory, so the receiver owns an ordinary writable tensor.

Items holding ObjectRefs must keep Ray's own serializer (it tracks the references): `pack`
raises `UsesRaySerializer` for them and the caller falls back to a plain `ray.put`.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass

import numpy as np
import ray
import ray.cloudpickle as cloudpickle
import torch


class UsesRaySerializer(Exception):
    """The object holds something only Ray's serializer handles correctly (an ObjectRef)."""


@dataclass
class Packed:
    data: bytes
    buffers: list[np.ndarray]  # one uint8 array per tensor, stored out of band by Ray


class OwnedBuffer(bytearray):
    """Memory the reader owns outright (e.g. read from a file): its tensor wraps it without a copy."""


def _rebuild_tensor(buffer, dtype: str, shape: tuple[int, ...], requires_grad: bool, device: str) -> torch.Tensor:
    torch_dtype = getattr(torch, dtype.removeprefix("torch."))
    raw = np.frombuffer(buffer, dtype=np.uint8)
    if not isinstance(buffer, OwnedBuffer):
        raw = np.array(raw, copy=True)  # own it: store memory is shared
    if raw.size == 0:
        tensor = torch.empty(shape, dtype=torch_dtype)
    else:
        tensor = torch.from_numpy(raw).view(torch_dtype).reshape(shape)
    if device != "cpu":
        tensor = tensor.to(device)
    return tensor.requires_grad_(requires_grad)


class _Pickler(cloudpickle.CloudPickler):
    def reducer_override(self, obj):
        if isinstance(obj, ray.ObjectRef):
            raise UsesRaySerializer(type(obj).__name__)
        if type(obj) is torch.Tensor and obj.layout == torch.strided:
            flat = obj.detach().to("cpu").contiguous().reshape(-1)
            buffer = pickle.PickleBuffer(flat.view(torch.uint8).numpy())
            args = (buffer, str(obj.dtype), tuple(obj.shape), obj.requires_grad, str(obj.device))
            return _rebuild_tensor, args
        return super().reducer_override(obj)


def pack(obj) -> Packed:
    buffers: list[pickle.PickleBuffer] = []
    stream = io.BytesIO()
    _Pickler(stream, protocol=5, buffer_callback=buffers.append).dump(obj)
    return Packed(stream.getvalue(), [np.frombuffer(b.raw(), dtype=np.uint8) for b in buffers])


def unpack(packed: Packed):
    return pickle.loads(packed.data, buffers=packed.buffers)
