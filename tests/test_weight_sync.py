"""Weight sync between real worker groups over gloo: actor layouts -> rollout layouts, exactly."""

import pytest
import torch
from torch import nn

from rlinf_like.hybrid_engines.reshard import (
    SyncPlan,
    WeightReceiver,
    WeightSender,
    dtensor_layout,
    dtype_from_name,
    replicated,
    sharded,
)
from rlinf_like.runtime import Worker, WorkerError, connect_groups, wait_all

# Odd sizes on purpose: FSDP chunks of 7 over 2 ranks are 4 + 3; TP=3 over 10 is 4 + 3 + 3.
SHAPES = {"0.weight": (10, 7), "0.bias": (10,), "1.weight": (7, 10), "1.bias": (7,)}


def reference_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 10), nn.Linear(10, 7))
    return model, {n: p.detach().clone() for n, p in model.named_parameters()}


def rollout_layouts(tp: int, dtype: str = "torch.float32"):
    """Megatron-style TP: column-parallel first layer, row-parallel second, its bias replicated."""
    return [sharded("0.weight", SHAPES["0.weight"], tp, dim=0, dtype=dtype),
            sharded("0.bias", SHAPES["0.bias"], tp, dim=0, dtype=dtype),
            sharded("1.weight", SHAPES["1.weight"], tp, dim=1, dtype=dtype),
            replicated("1.bias", SHAPES["1.bias"], tp, dtype=dtype)]


class Actor(Worker):
    def __init__(self, style: str):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        model, full = reference_weights()
        mesh = init_device_mesh("cpu", (self.world_size,))
        if style == "fsdp":
            from torch.distributed.fsdp import fully_shard

            fully_shard(model, mesh=mesh)
            self.tensors = dict(model.named_parameters())
        else:  # DTensor tensor parallel, as parallelize_module would lay it out
            placements = {"0.weight": Shard(0), "0.bias": Shard(0), "1.weight": Shard(1), "1.bias": Replicate()}
            self.tensors = {n: distribute_tensor(full[n], mesh, [placements[n]]) for n in full}
        self.sender = {}

    def layouts(self):
        return [dtensor_layout(name, t) for name, t in self.tensors.items()]

    def init_sender(self, name, plan, transport="group"):
        self.sender[name] = WeightSender(self.peer_group(name), plan, self.rank, transport)

    def publish(self, name, version, fail_rank=None):
        if self.rank == fail_rank:  # this rank dies after the handshake, before sending anything
            self.sender[name]._handshake(version)
            raise RuntimeError("actor rank lost mid-sync")
        return self.sender[name].publish(version, self.tensors)

    def full(self):
        return {n: t.full_tensor() for n, t in self.tensors.items()}

    def scale(self, factor):
        with torch.no_grad():
            for t in self.tensors.values():
                t.to_local().mul_(factor)


class Rollout(Worker):
    def __init__(self, tp: int):
        self.tp = tp

    def layouts(self, dtype="torch.float32"):
        return rollout_layouts(self.tp, dtype)

    def init_receiver(self, name, plan, transport="group"):
        dtype = dtype_from_name(plan.dst_dtypes["0.weight"])
        self.tensors = {l.name: torch.full(l.local_shape(self.rank), float("nan"), dtype=dtype)
                        for l in self.layouts()}
        self.receiver = WeightReceiver(self.peer_group(name), plan, self.rank, self.tensors, transport)

    def apply(self, version, timeout_s=None):
        return self.receiver.apply(version, timeout_s)

    def local(self):
        return self.tensors, self.receiver.version


def assemble(local_shards, layouts):
    """Rebuild full tensors from the rollout ranks' shards, checking replicas agree."""
    out = {}
    for layout in layouts:
        full = torch.full(layout.shape, float("nan"), dtype=dtype_from_name(layout.dtype))
        for rank, (tensors, _) in enumerate(local_shards):
            region = full[tuple(slice(a, b) for a, b in layout.boxes[rank])]
            if not torch.isnan(region).all():
                assert torch.equal(region, tensors[layout.name]), f"replicas of {layout.name} differ"
            region.copy_(tensors[layout.name])
        out[layout.name] = full
    return out


@pytest.fixture(scope="module")
def actors(cluster):
    placement = cluster.place({"fsdp_actor": "0-1", "tp_actor": "0-1", "rollout_tp1": "0", "rollout_tp2": "0-1",
                               "rollout_tp3": "1*3"})
    groups = {
        "fsdp": Actor.create_group("fsdp").launch(cluster, placement, "fsdp_actor"),
        "tp": Actor.create_group("tensor_parallel").launch(cluster, placement, "tp_actor"),
    }
    rollouts = {tp: Rollout.create_group(tp).launch(cluster, placement, f"rollout_tp{tp}") for tp in (1, 2, 3)}
    yield groups, rollouts
    for g in [*groups.values(), *rollouts.values()]:
        g.shutdown()


def setup_pair(actor, rollout, name, bucket_bytes=64, transport="group", dtype="torch.float32"):
    connect_groups(actor, rollout, name)
    [src] = actor.on_ranks(0).layouts().wait()
    [dst] = rollout.on_ranks(0).layouts(dtype).wait()
    plan = SyncPlan.build(src, dst, actor.name, rollout.name, bucket_bytes=bucket_bytes)
    wait_all([actor.init_sender(name, plan, transport), rollout.init_receiver(name, plan, transport)])
    return plan, dst


def sync(actor, rollout, name, version, actor_version=None):
    return wait_all([actor.publish(name, version if actor_version is None else actor_version),
                     rollout.apply(version)], timeout=60)


@pytest.mark.parametrize("style,tp", [("fsdp", 1), ("fsdp", 2), ("tp", 1), ("tp", 3)],
                         ids=["fsdp-dp2->tp1", "fsdp-dp2->tp2", "dtensor-tp2->tp1", "dtensor-tp2->tp3"])
def test_rollout_weights_equal_actor_weights_exactly(actors, style, tp):
    groups, rollouts = actors
    actor, rollout = groups[style], rollouts[tp]
    name = f"sync-{style}-{tp}"
    plan, dst_layouts = setup_pair(actor, rollout, name)
    assert len(plan.buckets) > len({(b.src_rank, b.dst_rank) for b in plan.buckets})  # buckets were split

    sent, received = sync(actor, rollout, name, 1)
    assert sum(sent) == sum(received) == plan.nbytes
    actor_full = actor.full().wait()[0]  # full_tensor() is a collective: every rank takes part
    shards = rollout.local().wait()
    assert {v for _, v in shards} == {1}
    for n, t in assemble(shards, dst_layouts).items():
        assert torch.equal(t, actor_full[n]), n

    # the next version carries the trained (here: scaled) weights
    actor.scale(2.0).wait()
    sync(actor, rollout, name, 2)
    for n, t in assemble(rollout.local().wait(), dst_layouts).items():
        assert torch.equal(t, actor_full[n] * 2.0), n
    actor.scale(0.5).wait()  # restore for the other cases


@pytest.mark.parametrize("transport,dtype", [("ipc", "torch.float32"), ("group", "torch.bfloat16"),
                                             ("ipc", "torch.bfloat16")])
def test_transports_and_dtype_conversion(actors, transport, dtype):
    """Shared-memory handles instead of sends; an fp32 actor feeding a bf16 rollout casts at the sender,
    so half the bytes travel and the rollout holds exactly the rounded actor weights."""
    groups, rollouts = actors
    actor, rollout = groups["fsdp"], rollouts[2]
    name = f"sync-{transport}-{dtype}"
    plan, dst_layouts = setup_pair(actor, rollout, name, transport=transport, dtype=dtype)
    itemsize = torch.empty(0, dtype=dtype_from_name(dtype)).element_size()
    for version, factor in ((1, 1.0), (2, 2.0)):  # the second round reuses the shared buffers
        actor.scale(factor).wait()
        sent, received = sync(actor, rollout, name, version)
        assert sum(received) == plan.nbytes
        actor_full = actor.full().wait()[0]
        for n, t in assemble(rollout.local().wait(), dst_layouts).items():
            assert t.dtype == dtype_from_name(dtype)
            assert torch.equal(t, actor_full[n].to(t.dtype)), n
    actor.scale(0.5).wait()
    # replicated 1.bias goes to both rollout ranks; everything else once
    numel = sum(torch.Size(shape).numel() for shape in SHAPES.values())
    assert sum(t.nbytes for b in plan.buckets for t in b.transfers) == (numel + 7) * itemsize


def test_stale_and_mismatched_versions_are_rejected_on_both_sides(actors):
    groups, rollouts = actors
    actor, rollout = groups["fsdp"], rollouts[2]
    name = "sync-versions"
    setup_pair(actor, rollout, name)
    sync(actor, rollout, name, 5)
    before = rollout.local().wait()

    with pytest.raises(WorkerError, match="stale weight version 5|rejected"):
        sync(actor, rollout, name, 5)
    with pytest.raises(WorkerError, match="asked for weight version 7, the actor sent 6|rejected"):
        sync(actor, rollout, name, 7, actor_version=6)
    after = rollout.local().wait()
    assert [v for _, v in after] == [5, 5]  # nothing was applied
    for (b, _), (a, _) in zip(before, after):
        assert all(torch.equal(b[n], a[n]) for n in b)
    sync(actor, rollout, name, 6)  # the pair still works afterwards
    assert {v for _, v in rollout.local().wait()} == {6}


def test_dtensor_layout_matches_local_shards(actors):
    groups, _ = actors
    layouts = groups["fsdp"].on_ranks(0).layouts().wait()[0]
    boxes = {l.name: l.boxes for l in layouts}
    assert boxes["0.weight"] == (((0, 5), (0, 7)), ((5, 10), (0, 7)))
    assert boxes["1.weight"] == (((0, 4), (0, 10)), ((4, 7), (0, 10)))  # chunk: 4 + 3
    assert all(l.dtype == "torch.float32" for l in layouts)


def test_a_partial_round_raises_and_keeps_the_previous_weights(actors):
    groups, rollouts = actors
    actor, rollout = groups["tp"], rollouts[1]
    name = "sync-partial"
    setup_pair(actor, rollout, name)
    sync(actor, rollout, name, 1)
    before, _ = rollout.local().wait()[0]
    actor.scale(3.0).wait()
    try:
        # rank 0 sends its buckets, rank 1 never does: the rollout gets only part of version 2
        sending = actor.publish(name, 2, fail_rank=1)
        with pytest.raises(WorkerError, match="did not complete"):
            rollout.apply(2, timeout_s=3).wait(timeout=60)
        with pytest.raises(WorkerError, match="actor rank lost mid-sync"):
            sending.wait(timeout=60)
    finally:
        actor.scale(1 / 3.0).wait()
    after, version = rollout.local().wait()[0]
    assert version == 1
    assert all(torch.equal(before[n], after[n]) for n in before)  # nothing of version 2 was written
