"""How a weight-sync round's buckets travel once the handshake has agreed on them (`reshard/sync.py`).

A transport is a registered class (`TRANSPORTS`, picked by name); every sender and receiver endpoint holds one
instance of it, so per-endpoint state (shared-memory handles) lives with the transport that needs it:

* `group`: each bucket's transfers as point-to-point messages over the peer process group (gloo on CPU, NCCL on
  GPU). On CPU the packed buffers are dropped after each round (`releases_buffers`).
* `ipc`: each packed bucket shared as a handle through the group's store (named shared memory on CPU, CUDA IPC on
  GPU); the receiver copies straight out of the sender's buffer. Every pair must be on one node. The buffers are
  reused across rounds, and a closing barrier tells the sender they may be overwritten.
"""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import weakref
from collections.abc import Mapping, Sequence
from multiprocessing.reduction import ForkingPickler

import torch

from rlinf_like.hybrid_engines.tensors import local_tensor
from rlinf_like.utils.registry import Registry


class WeightSyncError(RuntimeError):
    """A sync round was rejected (stale or mismatched version) or did not complete."""


class Transport:
    releases_buffers = False  # on CPU, drop the packed buffers after each round (host memory between rounds)

    def send(self, sender, version: int, buckets: Sequence, tensors: Mapping[str, torch.Tensor],
             timeout_s: float | None) -> None:
        raise NotImplementedError

    def receive(self, receiver, version: int, buckets: Sequence, timeout_s: float | None) -> list[torch.Tensor]:
        """One packed buffer per bucket, all arrived."""
        raise NotImplementedError

    def received(self, receiver, version: int, timeout_s: float | None) -> None:
        """After the receiver has copied the round into its weights."""


TRANSPORTS: Registry[type[Transport]] = Registry("weight-sync transport")


@TRANSPORTS.register("group")
class GroupTransport(Transport):
    releases_buffers = True

    def send(self, sender, version, buckets, tensors, timeout_s):
        works = [work for bucket in buckets for work in sender.post_bucket(bucket, tensors)]
        sender.wait_all(works, f"sending version {version}", timeout_s)

    def receive(self, receiver, version, buckets, timeout_s):
        buffers, works = [], []
        for bucket in buckets:  # one message per transfer, into its slot of the bucket's buffer
            buffers.append(receiver.buffer(bucket, receiver.group.device))
            src = receiver.peer(receiver.plan.src_group, bucket.src_rank)
            for i, (t, offset) in enumerate(zip(bucket.transfers, bucket.offsets)):
                slot = buffers[-1][offset: offset + t.nbytes]
                works.append(receiver.group.post_recv(slot, src, message_tag(bucket, i)))
        receiver.wait_all(works, f"receiving version {version}", timeout_s)
        return buffers


@TRANSPORTS.register("ipc")
class IpcTransport(Transport):
    def __init__(self):
        self._handles: dict[int, tuple[torch.Tensor, bytes]] = {}  # sender: bucket tag -> (buffer, its handle)
        self._opened: dict[int, tuple[bytes, torch.Tensor]] = {}  # receiver: bucket tag -> (handle, sender's buffer)

    def _pack(self, sender, bucket, tensors) -> None:
        """Into a buffer where the weights live, shared once, then reused with the same handle."""
        device = local_tensor(tensors[bucket.transfers[0].src_name]).device
        buffer = sender.buffer(bucket, device)
        if self._handles.get(bucket.tag, (None,))[0] is not buffer:
            self._handles[bucket.tag] = (buffer, share(buffer))
            _SHARED_HERE[self._handles[bucket.tag][1]] = buffer
        for t, offset in zip(bucket.transfers, bucket.offsets):
            sender.copy_in(buffer, offset, t, tensors)

    def send(self, sender, version, buckets, tensors, timeout_s):
        for bucket in buckets:
            self._pack(sender, bucket, tensors)
        where, store = (socket.gethostname(), os.getpid()), sender.group.store
        for bucket in buckets:
            store.set(handle_key(sender.plan, version, bucket), pickle.dumps((where, self._handles[bucket.tag][1])))
        sender.wait_all([sender.group.post_barrier()], f"version {version} over ipc", timeout_s)
        for bucket in buckets:
            store.delete_key(handle_key(sender.plan, version, bucket))

    def _open(self, receiver, version, bucket, timeout_s) -> torch.Tensor:
        key = handle_key(receiver.plan, version, bucket)
        try:
            receiver.group.store.wait([key], datetime.timedelta(seconds=timeout_s or receiver.group.timeout_s))
        except RuntimeError as err:
            raise WeightSyncError(f"peer group {receiver.group.name!r}: bucket {bucket.tag} of version {version} "
                                  f"was not shared in time: {err}") from err
        (host, pid), handle = pickle.loads(receiver.group.store.get(key))
        if host != socket.gethostname():
            raise WeightSyncError(f"transport 'ipc' needs one node: actor rank {bucket.src_rank} is on {host!r}, "
                                  f"rollout rank {receiver.rank} on {socket.gethostname()!r}; use transport 'group'")
        cached = self._opened.get(bucket.tag)
        if cached is None or cached[0] != handle:  # the sender reuses its buffers: open each once
            # CUDA refuses to open an IPC handle in the process that made it (the in-process backend)
            mine = _SHARED_HERE.get(handle) if pid == os.getpid() else None
            self._opened[bucket.tag] = (handle, mine if mine is not None else pickle.loads(handle))
        return self._opened[bucket.tag][1]

    def receive(self, receiver, version, buckets, timeout_s):
        return [self._open(receiver, version, bucket, timeout_s) for bucket in buckets]

    def received(self, receiver, version, timeout_s):
        receiver.wait_all([receiver.group.post_barrier()], f"version {version} over ipc", timeout_s)


# handle -> the buffer it shares, for receivers in the sending process (weak: a dropped buffer leaves no entry)
_SHARED_HERE: weakref.WeakValueDictionary[bytes, torch.Tensor] = weakref.WeakValueDictionary()


def handle_key(plan, version: int, bucket) -> str:
    return f"weight-sync/{plan.src_group}->{plan.dst_group}/v{version}/bucket{bucket.tag}"


_MAX_TRANSFERS_PER_BUCKET = 1 << 16


def message_tag(bucket, index: int) -> int:
    """The tag of a bucket's `index`-th transfer: unique in a round on both sides (gloo tags are 32-bit)."""
    if len(bucket.transfers) > _MAX_TRANSFERS_PER_BUCKET or bucket.tag >= 1 << 15:
        raise WeightSyncError(f"bucket {bucket.tag} with {len(bucket.transfers)} transfers exceeds the tag space")
    return bucket.tag * _MAX_TRANSFERS_PER_BUCKET + index


def share(buffer: torch.Tensor) -> bytes:
    """A handle any process on this node can open: torch's multiprocessing reduction gives a CUDA IPC
    handle on GPU, and on CPU (under the file_system strategy) moves the buffer into named shared
    memory. The strategy is switched only for this call: it is process-wide."""
    previous = torch.multiprocessing.get_sharing_strategy()
    torch.multiprocessing.set_sharing_strategy("file_system")
    try:
        return bytes(ForkingPickler.dumps(buffer))
    finally:
        torch.multiprocessing.set_sharing_strategy(previous)
