"""Worker / WorkerGroup on a real Ray instance with real gloo groups."""

import asyncio
import os
import time

import pytest
import torch
import torch.distributed as dist

from rlinf_like.runtime.errors import PlacementError
from rlinf_like.runtime import (
    GroupTimeoutError,
    Worker,
    WorkerError,
    connect_groups,
    wait_all,
)


class Probe(Worker):
    def __init__(self, base: int):
        # rank and world size are already known in __init__
        self.value = base * 100 + self.rank * 10 + self.world_size

    def identity(self):
        return {"rank": self.rank, "world": self.world_size, "group": self.group_name,
                "device": (self.device.kind, self.device.index), "value": self.value,
                "omp": os.environ.get("OMP_NUM_THREADS"), "pid": os.getpid()}

    def add(self, x, y=0):
        return self.value + x + y

    def all_reduce_ranks(self):
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t, group=self.process_group)
        return t.item()

    def fail(self):
        raise ValueError(f"bad batch on rank {self.rank}")

    def sleep(self, seconds):
        time.sleep(seconds)
        return self.rank

    def barrier_then(self):
        dist.barrier()
        return self.rank

    def peer_broadcast(self, name, src):
        pg = self.peer_group(name)
        t = torch.full((4,), float(pg.rank)) if pg.rank == src else torch.zeros(4)
        pg.broadcast(t, src)
        return t.tolist()

    def peer_ranks(self, name):
        pg = self.peer_group(name)
        return pg.rank, pg.world_size, pg.ranks


@pytest.fixture(scope="module")
def groups(cluster):
    """Two collocated 2-rank groups on the two CPU slots (each rank reserves half a slot)."""
    placement = cluster.place({"actor,rollout": "0-1"})
    actor = Probe.create_group(1).launch(cluster, placement, "actor")
    rollout = Probe.create_group(2).launch(cluster, placement, "rollout")
    connect_groups(actor, rollout, "weights")
    yield actor, rollout
    actor.shutdown()
    rollout.shutdown()


def test_ranks_know_their_context(groups):
    actor, _ = groups
    ids = actor.identity().wait()
    assert [i["rank"] for i in ids] == [0, 1]
    assert {i["world"] for i in ids} == {2} and {i["group"] for i in ids} == {"actor"}
    assert [i["device"] for i in ids] == [("cpu", 0), ("cpu", 1)]
    assert [i["value"] for i in ids] == [102, 112]
    assert {i["omp"] for i in ids} == {"1"}
    assert len({i["pid"] for i in ids}) == 2  # one process per rank


def test_fan_out_subset_and_kwargs(groups):
    actor, rollout = groups
    assert actor.add(1, y=2).wait() == [105, 115]
    assert rollout.on_ranks(1).add(5).wait() == [217]
    assert actor.call("add", 0, ranks=[1, 0]).wait() == [112, 102]


def test_async_form(groups):
    actor, rollout = groups

    async def both():
        return await asyncio.gather(actor.add(0), rollout.add(0))

    assert asyncio.run(both()) == [[102, 112], [202, 212]]


def test_group_process_group_is_eager_and_exact(groups):
    actor, rollout = groups
    assert actor.all_reduce_ranks().wait() == [3.0, 3.0]
    assert rollout.all_reduce_ranks().wait() == [3.0, 3.0]


def test_peer_group_spans_both_groups(groups):
    actor, rollout = groups
    a, r = wait_all([actor.peer_ranks("weights"), rollout.peer_ranks("weights")])
    assert [x[0] for x in a + r] == [0, 1, 2, 3]
    assert a[0][2] == {"actor": [0, 1], "rollout": [2, 3]}
    # actor rank 0 (peer rank 0) -> everyone, then rollout rank 1 (peer rank 3) -> everyone
    for src in (0, 3):
        a, r = wait_all([actor.peer_broadcast("weights", src), rollout.peer_broadcast("weights", src)])
        assert a + r == [[float(src)] * 4] * 4


def test_unknown_peer_group_and_method(groups):
    actor, _ = groups
    with pytest.raises(WorkerError, match="no peer group 'nope'"):
        actor.peer_broadcast("nope", 0).wait()
    with pytest.raises(AttributeError, match="no method 'trian'"):
        actor.trian()
    with pytest.raises(IndexError, match="ranks 0-1; asked for \\[5\\]"):
        actor.on_ranks(5).add(1)


def test_worker_exception_names_group_rank_and_traceback(groups):
    actor, _ = groups
    with pytest.raises(WorkerError) as err:
        actor.on_ranks(1).fail().wait()
    e = err.value
    assert (e.group, e.rank, e.method) == ("actor", 1, "fail")
    assert "actor[rank 1]" in str(e) and "bad batch on rank 1" in str(e)
    assert "in fail" in e.remote_traceback  # the frame that raised
    assert isinstance(e.cause, ValueError)
    assert actor.add(0).wait() == [102, 112]  # the group keeps serving


def test_wait_timeout_names_pending_ranks(groups):
    actor, _ = groups
    handle = actor.call("sleep", 3.0, ranks=[0, 1])
    t0 = time.monotonic()
    with pytest.raises(GroupTimeoutError) as err:
        handle.wait(timeout=0.5)
    assert time.monotonic() - t0 < 2.0
    assert err.value.pending_ranks == [0, 1] and "'actor'" in str(err.value)
    assert handle.wait() == [0, 1]  # the calls themselves finish


def test_a_rank_that_would_overfill_a_device_is_refused_by_name_before_it_starts(cluster, groups):
    # Both CPU slots are half-held by actor and half by rollout; a rank that wants a whole slot
    # must not be started beside them, and the error names the device and who holds it.
    placement = cluster.place({"greedy": "0"})
    t0 = time.monotonic()
    with pytest.raises(PlacementError, match=r"'greedy' needs 1 of cpu device 0, but running groups hold 'actor' "
                                             r"0.5, 'rollout' 0.5"):
        Probe.create_group(0).launch(cluster, placement, "greedy", timeout=3)
    assert time.monotonic() - t0 < 1


def test_device_shares_free_at_shutdown_and_when_a_group_is_dropped(cluster):
    from rlinf_like.runtime.device_shares import DeviceShares

    shares, whole = DeviceShares(), cluster.place({"a": "0"})["a"].ranks
    thirds = cluster.place({"x": "0", "y": "0", "z": "0"})

    class G:  # any object stands for a group: what is held is keyed by it
        pass

    held = [G() for _ in range(3)]
    for g, n in zip(held, "xyz"):
        shares.claim(g, n, thirds[n].ranks)  # three thirds fill the device exactly
    with pytest.raises(PlacementError, match="'a' needs 1 of cpu device 0"):
        shares.claim(G(), "a", whole)
    shares.free(held.pop())
    with pytest.raises(PlacementError, match="'a' needs 1 of cpu device 0"):
        shares.claim(G(), "a", whole)
    shares.free(held.pop())
    del held[:]  # the last holder dropped without a shutdown (a failed launch's group)
    shares.claim(G(), "a", whole)


def test_memory_metrics_read_host_memory_and_ask_busy_ranks_for_device_memory(groups):
    from rlinf_like.runners.reasoning.run_files import memory_metrics

    actor, _ = groups
    busy = actor.sleep(3)  # device_memory is a control method: a rank in a long call still answers
    start = time.monotonic()
    assert actor.call("device_memory").wait() == [None, None]  # CPU slots hold no device memory
    assert time.monotonic() - start < 2
    busy.wait()
    metrics = memory_metrics({"actor": actor, "critic": None})
    assert 0.05 < metrics["memory/actor_gb"] <= metrics["memory/actor_peak_gb"]
    assert not any("gpu" in key or "critic" in key for key in metrics)


@pytest.mark.gpu
def test_device_memory_reports_what_torch_holds_on_a_gpu():
    from rlinf_like.runtime import Cluster, ClusterConfig

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    with Cluster(ClusterConfig(backend="local")) as cluster:
        group = Probe.create_group(0).launch(cluster, cluster.place({"actor": "0"}), "actor", init_process_group=False)
        held = torch.ones(2**20, device="cuda:0")  # 4 MiB in this process, which hosts the in-process rank
        [(now, peak)] = group.call("device_memory").wait()
        assert peak >= now >= held.numel() * 4
        group.shutdown()
