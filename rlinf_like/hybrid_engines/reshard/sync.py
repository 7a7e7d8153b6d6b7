"""Weight sync over a peer process group: the actor publishes a version, the rollout applies it.

    plan = SyncPlan.build(actor_layouts, rollout_layouts, "actor", "rollout", bucket_bytes=256 << 20)
    # actor rank:   WeightSender(peer_group, plan, rank).publish(version, local_tensors)
    # rollout rank: WeightReceiver(peer_group, plan, rank, local_tensors).apply(version)

Both calls are collective over the two groups and follow the same plan, computed identically on
every rank from the two layouts. A round has three phases:
1. actor rank 0 broadcasts the version;
2. every rank votes: receivers reject a version that is not the one they asked for or is not newer
   than the one they hold; any rejection makes every rank raise (no one is left waiting);
3. each sender posts one send per bucket it owns, each receiver one recv per bucket it needs,
   then all wait (with the group's timeout). Receivers copy into their tensors only after every
   bucket has arrived, so a failed round leaves the previous weights and version intact.
Only the slices a target rank needs travel, packed per (sender, receiver) pair into buckets.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from rlinf_like.hybrid_engines.reshard.layout import Box, TensorLayout, box_slices, split_bounds
from rlinf_like.hybrid_engines.reshard.planner import NameMap, Transfer, bucketize, plan_reshard
from rlinf_like.hybrid_engines.tensors import local_tensor
from rlinf_like.scheduler.comm import PeerGroup


class WeightSyncError(RuntimeError):
    """A sync round was rejected (stale or mismatched version) or did not complete."""


def dtensor_layout(name: str, tensor) -> TensorLayout:
    """Shard metadata of a DTensor (FSDP2 / DTensor TP): the box every mesh rank holds."""
    mesh = tensor.device_mesh.mesh
    shape = tuple(tensor.shape)
    boxes: list[Box | None] = [None] * mesh.numel()
    for coord in itertools.product(*(range(n) for n in mesh.shape)):
        box = [[0, n] for n in shape]
        for mesh_dim, placement in enumerate(tensor.placements):
            if placement.is_shard():
                lo, hi = box[placement.dim]
                sub_lo, sub_hi = split_bounds(hi - lo, mesh.shape[mesh_dim], "chunk")[coord[mesh_dim]]
                box[placement.dim] = [lo + sub_lo, lo + sub_hi]
            elif not placement.is_replicate():
                raise ValueError(f"tensor {name!r}: placement {placement} cannot be synced (reduce it first)")
        boxes[int(mesh[coord])] = tuple((lo, hi) for lo, hi in box)
    return TensorLayout(name, shape, tuple(boxes), str(tensor.dtype))


@dataclass(frozen=True)
class Bucket:
    tag: int
    src_rank: int  # rank within the source group
    dst_rank: int  # rank within the target group
    transfers: tuple[Transfer, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.transfers)


@dataclass(frozen=True)
class SyncPlan:
    src_group: str
    dst_group: str
    buckets: tuple[Bucket, ...]
    dst_dtypes: Mapping[str, str]

    @classmethod
    def build(
        cls,
        sources: Sequence[TensorLayout],
        targets: Sequence[TensorLayout],
        src_group: str,
        dst_group: str,
        bucket_bytes: int = 256 << 20,
        name_map: NameMap | None = None,
    ) -> SyncPlan:
        pairs = bucketize(plan_reshard(sources, targets, name_map), bucket_bytes)
        buckets = []
        for (src, dst), groups in sorted(pairs.items()):
            for transfers in groups:
                buckets.append(Bucket(len(buckets), src, dst, tuple(transfers)))
        return cls(src_group, dst_group, tuple(buckets), {t.name: t.dtype for t in targets})

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)


class _Endpoint:
    def __init__(self, group: PeerGroup, plan: SyncPlan):
        for side in (plan.src_group, plan.dst_group):
            if side not in group.ranks:
                raise ValueError(f"peer group {group.name!r} has no group {side!r}; it joins {sorted(group.ranks)}")
        self.group, self.plan = group, plan

    def _peer(self, side: str, rank: int) -> int:
        return self.group.ranks[side][rank]

    def _handshake(self, version: int) -> None:
        header = torch.tensor([version], dtype=torch.int64)
        self.group.broadcast(header, src=self._peer(self.plan.src_group, 0))
        sent_version = int(header[0])
        reject_reason = self._check(sent_version)
        rejections = self.group.all_reduce(torch.tensor([0 if reject_reason is None else 1], dtype=torch.int64))
        if int(rejections[0]):
            raise WeightSyncError(
                reject_reason or f"weight version {sent_version} was rejected by {int(rejections[0])} rollout rank(s)"
            )

    def _check(self, sent_version: int) -> str | None:
        return None

    def _wait_all(self, works, what: str, timeout_s: float | None) -> None:
        try:
            for work in works:
                self.group.wait(work, timeout_s)
        except RuntimeError as err:
            raise WeightSyncError(f"peer group {self.group.name!r}: {what} did not complete: {err}") from err


class WeightSender(_Endpoint):
    def __init__(self, group: PeerGroup, plan: SyncPlan, rank: int):
        super().__init__(group, plan)
        self.rank = rank
        self.mine = [b for b in plan.buckets if b.src_rank == rank]

    def publish(self, version: int, tensors: Mapping[str, torch.Tensor], timeout_s: float | None = None) -> int:
        """Send this rank's slices of `tensors` (local shards or DTensors) as `version`; returns bytes sent.
        `timeout_s` bounds the data phase (default: the peer group's timeout)."""
        self._handshake(version)
        buffers, works = [], []
        for bucket in self.mine:
            pieces = []
            for t in bucket.transfers:
                local = local_tensor(tensors[t.src_name]).detach()
                pieces.append(local[box_slices(t.src_box)].contiguous().reshape(-1).view(torch.uint8))
            buffer = torch.cat(pieces) if len(pieces) > 1 else pieces[0]
            buffers.append(buffer)  # keep alive until the send completes
            works.append(self.group.post_send(buffer, self._peer(self.plan.dst_group, bucket.dst_rank), bucket.tag))
        self._wait_all(works, f"sending version {version}", timeout_s)
        return sum(b.numel() for b in buffers)


class WeightReceiver(_Endpoint):
    def __init__(self, group: PeerGroup, plan: SyncPlan, rank: int, tensors: Mapping[str, torch.Tensor]):
        super().__init__(group, plan)
        self.rank, self.tensors = rank, tensors
        self.mine = [b for b in plan.buckets if b.dst_rank == rank]
        self.version: int | None = None
        self._requested: int | None = None
        for name, dtype in plan.dst_dtypes.items():
            if name in tensors and str(tensors[name].dtype) != dtype:
                raise ValueError(f"tensor {name!r}: the plan carries {dtype}, the rollout holds {tensors[name].dtype}")

    def _check(self, sent_version: int) -> str | None:
        if sent_version != self._requested:
            return f"rollout rank {self.rank} asked for weight version {self._requested}, the actor sent {sent_version}"
        if self.version is not None and sent_version <= self.version:
            return f"stale weight version {sent_version}: rollout rank {self.rank} already holds version {self.version}"
        return None

    def apply(self, version: int, timeout_s: float | None = None) -> int:
        """Receive `version` into this rank's tensors; returns bytes received. If any bucket does not
        arrive (within `timeout_s`, default the peer group's timeout), raises and keeps the old weights."""
        self._requested = version
        self._handshake(version)
        buffers, works = [], []
        for bucket in self.mine:
            buffer = torch.empty(bucket.nbytes, dtype=torch.uint8)
            buffers.append(buffer)
            works.append(self.group.post_recv(buffer, self._peer(self.plan.src_group, bucket.src_rank), bucket.tag))
        self._wait_all(works, f"receiving version {version}", timeout_s)
        for bucket, buffer in zip(self.mine, buffers):  # everything arrived: now write the weights
            offset = 0
            for t in bucket.transfers:
                target = local_tensor(self.tensors[t.dst_name])
                piece = buffer[offset : offset + t.nbytes].view(target.dtype)
                with torch.no_grad():
                    target[box_slices(t.dst_box)].copy_(piece.view(tuple(hi - lo for lo, hi in t.dst_box)))
                offset += t.nbytes
        self.version = version
        return sum(b.numel() for b in buffers)
