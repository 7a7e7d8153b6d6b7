"""The channel's transports: /dev/shm payloads, the object-store fallback with claims, and the store's socket."""

import glob
import os
import threading
from multiprocessing import AuthenticationError
from dataclasses import dataclass

import pytest
import torch

from rlinf_like.runtime import Channel, ChannelClosed
from rlinf_like.runtime import channel_wire as wire


@dataclass
class Mixed:
    idx: int
    a: torch.Tensor
    b: torch.Tensor


_names = iter(range(10_000))


def items():
    """Alternating large (shm or object store) and small (inline) items with awkward tensors."""
    out = []
    for i in range(6):
        n = 40_000 if i % 2 == 0 else 3  # 80 KiB of bf16 crosses the inline limit; 3 elements stay inline
        a = torch.randn(n, dtype=torch.float32).to(torch.bfloat16)
        b = torch.arange(12, dtype=torch.float64).reshape(3, 4).t()  # non-contiguous
        out.append(Mixed(i, a, b))
    return out


def same_bits(x: torch.Tensor, y: torch.Tensor) -> bool:
    as_bytes = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return x.dtype == y.dtype and x.shape == y.shape and torch.equal(as_bytes(x), as_bytes(y))


def new_channel(shm: bool, maxsize: int = 0) -> Channel:
    ch = Channel.create(f"paths-{next(_names)}", item_type=Mixed, maxsize=maxsize)
    if not shm:
        ch._shm_node = None  # as a producer on a cluster of several nodes does
    return ch


@pytest.mark.parametrize("shm", [True, False], ids=["shm", "object-store"])
def test_mixed_items_keep_order_and_bits_and_leave_no_files(cluster, shm):
    ch = new_channel(shm)
    before = set(glob.glob(os.path.join(wire.SHM_DIR, wire.SHM_PREFIX + "*")))
    sent = items()
    for item in sent:
        ch.put(item, weight=1)
    got = [ch.get()] + ch.get_batch(3) + [ch.get(), ch.get()]  # single gets and a batch with claims inside
    assert [g.idx for g in got] == list(range(6))
    for s, g in zip(sent, got):
        assert same_bits(s.a, g.a) and same_bits(s.b, g.b)
        g.a[0] = 1.0  # owned and writable: not a view of the file's memory or the sender's tensor
    assert all(s.a[0].item() != 1.0 or s.idx % 2 for s in sent)
    assert set(glob.glob(os.path.join(wire.SHM_DIR, wire.SHM_PREFIX + "*"))) <= before  # every file was unlinked
    ch.destroy()


def test_destroy_unlinks_the_files_of_queued_items(cluster):
    ch = new_channel(shm=True)
    before = set(glob.glob(os.path.join(wire.SHM_DIR, wire.SHM_PREFIX + "*")))
    ch.put(items()[0])
    [path] = set(glob.glob(os.path.join(wire.SHM_DIR, wire.SHM_PREFIX + "*"))) - before
    ch.destroy()
    assert not os.path.exists(path)


def test_a_failed_put_leaves_no_file(cluster):
    ch = new_channel(shm=True)
    ch.close()
    before = set(glob.glob(os.path.join(wire.SHM_DIR, wire.SHM_PREFIX + "*")))
    with pytest.raises(ChannelClosed):
        ch.put(items()[0])
    assert set(glob.glob(os.path.join(wire.SHM_DIR, wire.SHM_PREFIX + "*"))) <= before


def test_the_store_refuses_a_client_without_the_key(cluster):
    ch = new_channel(shm=True).ready()
    refused = []

    def stranger():  # a thread of its own: no connection cached from ready()
        try:
            wire.request(ch._address, b"wrong key", "qsize", None)
        except AuthenticationError as err:
            refused.append(err)

    thread = threading.Thread(target=stranger)
    thread.start(), thread.join(10)
    assert refused
    assert ch.qsize() == 0  # the store still serves its real clients
