"""Typed Channel on a real Ray instance: between the driver and between workers."""

import asyncio
import os
import pickle
import threading
import time
from dataclasses import dataclass

import pytest
import torch

from rlinf_like.runtime import Channel, ChannelClosed, ChannelTimeout, Worker, WorkerError
from rlinf_like.runtime.channel import INLINE_MAX_TENSOR_BYTES, payload_nbytes


@dataclass
class Sample:
    idx: int
    tokens: torch.Tensor


@dataclass
class Other:
    idx: int


_names = iter(range(10_000))


def new_channel(maxsize=0, item_type=Sample):
    return Channel.create(f"test-{next(_names)}", item_type=item_type, maxsize=maxsize)


def small(i):
    return Sample(i, torch.tensor([i, i + 1]))


def test_wrong_type_names_channel_and_both_types(cluster):
    ch = new_channel()
    with pytest.raises(TypeError) as err:
        ch.put(Other(1))
    msg = str(err.value)
    assert ch.name in msg and "Sample" in msg and "Other" in msg
    assert ch.qsize() == 0


def test_fifo_per_key_and_keys_are_independent(cluster):
    ch = new_channel()
    for i in range(3):
        ch.put(small(i), key="a")
        ch.put(small(10 + i), key="b")
    assert ch.qsize() == 6 and ch.qsize("a") == 3
    assert [ch.get(key="b").idx for _ in range(3)] == [10, 11, 12]
    assert [ch.get(key="a").idx for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ChannelTimeout, match="key 'default'"):
        ch.get(timeout=0.2)


def test_items_round_trip_bit_exact_small_and_large(cluster):
    ch = new_channel()
    big = torch.randn(1 << 20)  # 4 MiB: goes by object-store reference
    ch.put(Sample(0, big))
    ch.put(small(1))
    out_big, out_small = ch.get(), ch.get()
    assert torch.equal(out_big.tokens, big) and out_big.tokens.dtype == big.dtype
    assert torch.equal(out_small.tokens, torch.tensor([1, 2]))


def test_large_payload_is_not_copied_into_the_store(cluster):
    ch = new_channel()
    item = Sample(0, torch.zeros(1 << 20))
    entry = ch._encode(item)
    assert entry[0] == "shm"  # one node: the tensor goes into a /dev/shm file the consumer reads
    # What travels to the store is a path and the pickle stream without the 4 MiB.
    assert len(pickle.dumps(entry)) < 1024 and os.path.getsize(entry[1]) == 4 << 20
    os.unlink(entry[1])
    ch._shm_node = None  # as on a cluster of several nodes: by object-store reference
    kind, data = ch._encode(item)
    assert kind == "packed" and len(pickle.dumps(data[0].hex())) < 1024
    assert ch._encode(small(1))[0] == "inline"
    assert payload_nbytes(item) == 4 << 20
    assert payload_nbytes({"a": [torch.zeros(4)]}) == 16
    assert payload_nbytes(small(1)) < INLINE_MAX_TENSOR_BYTES


def test_get_timeout_does_not_steal_a_later_item(cluster):
    ch = new_channel()
    assert ch.qsize() == 0  # the store's process is up, so only the timeout is timed
    t0 = time.monotonic()
    with pytest.raises(ChannelTimeout, match=ch.name):
        ch.get(timeout=0.5)
    assert 0.4 < time.monotonic() - t0 < 3
    ch.put(small(7))
    assert ch.get(timeout=5).idx == 7


def test_backpressure_blocks_when_full(cluster):
    ch = new_channel(maxsize=2)
    ch.put(small(0))
    ch.put(small(1))
    with pytest.raises(ChannelTimeout, match="stayed full"):
        ch.put(small(2), timeout=0.3)
    assert ch.qsize() == 2  # the refused item was not added

    done = threading.Event()

    def producer():
        ch.put(small(2))  # blocks until a consumer makes room
        done.set()

    threading.Thread(target=producer, daemon=True).start()
    assert not done.wait(0.5)
    assert ch.get().idx == 0
    assert done.wait(5)
    assert [ch.get().idx, ch.get().idx] == [1, 2]


def test_close_ends_the_stream_after_draining(cluster):
    ch = new_channel()
    for i in range(3):
        ch.put(small(i))
    ch.close()
    assert ch.closed
    with pytest.raises(ChannelClosed, match="put on closed channel"):
        ch.put(small(9))
    assert [s.idx for s in ch] == [0, 1, 2]
    with pytest.raises(ChannelClosed):
        ch.get(timeout=1)


def test_close_wakes_a_blocked_consumer(cluster):
    ch = new_channel()
    result = {}

    def consumer():
        try:
            ch.get()
        except ChannelClosed as err:
            result["err"] = err

    t = threading.Thread(target=consumer, daemon=True)
    t.start()
    time.sleep(0.3)
    ch.close()
    t.join(5)
    assert isinstance(result.get("err"), ChannelClosed)


def test_get_batch_by_weight(cluster):
    ch = new_channel()
    for i, w in enumerate([3, 2, 4, 1]):
        ch.put(small(i), weight=w)
    assert [s.idx for s in ch.get_batch(5)] == [0, 1]  # 3 + 2 reaches 5
    assert [s.idx for s in ch.get_batch(4)] == [2]
    # Not enough weight yet: the timeout returns the taken item to the queue, losing nothing.
    with pytest.raises(ChannelTimeout):
        ch.get_batch(10, timeout=0.3)
    assert ch.qsize() == 1
    ch.put(small(4), weight=9)
    assert [s.idx for s in ch.get_batch(10)] == [3, 4]
    ch.put(small(5), weight=1)
    ch.close()
    assert [s.idx for s in ch.get_batch(10)] == [5]  # closed: the remainder
    with pytest.raises(ChannelClosed):
        ch.get_batch(1)
    with pytest.raises(ValueError, match="target_weight > 0"):
        ch.get_batch(0)


def test_async_put_and_get(cluster):
    ch = new_channel(maxsize=4)

    async def run():
        consumer = asyncio.ensure_future(asyncio.gather(*(ch.get_async() for _ in range(3))))
        for i in range(3):
            await ch.put_async(small(i))
        got = await consumer
        await ch.put_async(small(5), weight=2)
        batch = await ch.get_batch_async(2)
        return sorted(s.idx for s in got), [s.idx for s in batch]

    assert asyncio.run(run()) == ([0, 1, 2], [5])


def test_duplicate_name_and_connect(cluster):
    ch = new_channel(item_type=Other)
    with pytest.raises(ValueError, match="already exists"):
        Channel.create(ch.name, item_type=Other)
    same = Channel.connect(ch.name)
    assert same.item_type is Other
    same.put(Other(3))
    assert ch.get().idx == 3
    with pytest.raises(KeyError, match="no channel named 'missing'"):
        Channel.connect("missing")


def test_a_dead_store_is_reported_by_channel_name(cluster):
    ch = new_channel()
    ch.put(small(1))
    ch.destroy()
    with pytest.raises(ChannelClosed, match=f"channel '{ch.name}': its store actor is gone"):
        ch.get(timeout=5)
    with pytest.raises(ChannelClosed, match=ch.name):
        ch.put(small(2))


class Producer(Worker):
    def produce(self, ch: Channel, n: int, numel: int):
        for i in range(n):
            torch.manual_seed(i)
            ch.put(Sample(self.rank * 1000 + i, torch.randn(numel)))
        return n

    def put_wrong(self, ch: Channel):
        ch.put(Other(0))


class Consumer(Worker):
    def consume(self, name: str, n: int):
        ch = Channel.connect(name)
        out = []
        for _ in range(n):
            s = ch.get(timeout=60)
            torch.manual_seed(s.idx % 1000)
            out.append((s.idx, bool(torch.equal(s.tokens, torch.randn(s.tokens.numel())))))
        return out


def test_workers_exchange_tensors_over_a_channel(cluster):
    placement = cluster.place({"producer": "0", "consumer": "1"})
    producers = Producer.create_group().launch(cluster, placement, "producer", init_process_group=False)
    consumers = Consumer.create_group().launch(cluster, placement, "consumer", init_process_group=False)
    try:
        ch = Channel.create("worker-exchange", item_type=Sample, maxsize=3)
        pending = consumers.consume(ch.name, 8)
        assert producers.produce(ch, 8, 300_000).wait(timeout=120) == [8]  # 1.2 MiB items, by reference
        [received] = pending.wait(timeout=120)
        assert [idx for idx, _ in received] == list(range(8))
        assert all(ok for _, ok in received)
        with pytest.raises(WorkerError, match="carries Sample, got .*Other"):
            producers.put_wrong(ch).wait()
    finally:
        producers.shutdown()
        consumers.shutdown()


@dataclass
class WithRef:
    ref: object
    data: torch.Tensor


def test_items_holding_object_refs_keep_rays_serializer(cluster):
    import ray

    ch = new_channel(item_type=WithRef)
    inner = ray.put(torch.arange(5))
    ch.put(WithRef(inner, torch.zeros(1 << 16)))
    out = ch.get()
    assert torch.equal(ray.get(out.ref), torch.arange(5)) and out.data.numel() == 1 << 16


def test_the_store_process_imports_no_torch():
    """A channel's store is a Ray actor of its own: the process imports `channel_store` to unpickle it. Without
    torch and the rest of the package it starts ~1.3 s sooner, once per channel of every run."""
    import subprocess
    import sys

    code = ("import sys, rlinf_like.runtime.channel_store; "
            "print(sorted(m for m in ('torch', 'numpy', 'rlinf_like.runtime.channel') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
