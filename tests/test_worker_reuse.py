"""cluster.reuse_workers: a shut-down group's rank processes host the next group's ranks, as good as new ones.

The session cluster (conftest.py) reuses its workers, so every Ray test after the first runs on kept processes;
these tests pin what a kept process must look like to its next worker."""

import os
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist

from rlinf_like.runtime import Worker


class Dirty(Worker):
    """Changes what a worker can change in its process."""

    def __init__(self):
        os.environ["RLINF_REUSE_PROBE"] = "set by the first worker"
        sys.path.append("/nonexistent/rlinf-reuse-probe")
        torch.set_default_dtype(torch.float64)
        torch.manual_seed(1234)
        torch.set_grad_enabled(False)
        from tqdm.auto import tqdm

        for _ in tqdm(range(2), file=sys.stderr):  # a first progress bar starts tqdm's monitor thread
            pass
        from rlinf_like.workers.reward.fn import call_with_timeout

        assert call_with_timeout(abs, 5.0, -2) == 2  # a reward call starts this thread's call thread, kept for the next

    def pid(self):
        return os.getpid()


class Fresh(Worker):
    def state(self):
        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t, group=self.process_group)
        return {"pid": os.getpid(), "env": os.environ.get("RLINF_REUSE_PROBE"),
                "path": "/nonexistent/rlinf-reuse-probe" in sys.path, "dtype": torch.get_default_dtype(),
                "grad": torch.is_grad_enabled(), "seed": torch.initial_seed(), "draw": torch.rand(3).tolist(),
                "world": dist.get_world_size(), "sum": t.item(), "group": self.group_name, "rank": self.rank}


class LeavesAThread(Worker):
    def __init__(self):
        threading.Thread(target=time.sleep, args=(3600,), daemon=True, name="left-behind").start()

    def pid(self):
        return os.getpid()


def test_a_kept_process_hosts_the_next_group_as_a_new_one_would(cluster):
    placement = cluster.place({"first": "0-1", "second": "0-1"})
    first = Dirty.create_group().launch(cluster, placement, "first")
    pids = first.pid().wait()
    first.shutdown()
    second = Fresh.create_group().launch(cluster, placement, "second")
    try:
        states = second.state().wait()
    finally:
        second.shutdown()
    assert [s["pid"] for s in states] == pids  # the same processes, rank for rank
    seeded = torch.rand(3, generator=torch.Generator().manual_seed(1234)).tolist()
    for s in states:
        assert s["env"] is None and not s["path"] and s["dtype"] == torch.float32 and s["grad"]
        assert s["seed"] != 1234 and s["draw"] != seeded  # reseeded from the OS, as a new process's generator is
        assert s["world"] == 2 and s["sum"] == 3.0  # a new default process group of the new group's ranks
    assert [(s["group"], s["rank"]) for s in states] == [("second", 0), ("second", 1)]
    assert states[0]["seed"] != states[1]["seed"]


def test_a_process_left_with_a_running_thread_is_ended_not_kept(cluster):
    placement = cluster.place({"first": "0", "second": "0"})
    first = LeavesAThread.create_group().launch(cluster, placement, "first")
    [pid] = first.pid().wait()
    first.shutdown()
    second = Dirty.create_group().launch(cluster, placement, "second")
    try:
        assert second.pid().wait() != [pid]
    finally:
        second.shutdown()


def test_a_run_on_a_borrowed_cluster_ends_its_groups_and_channels_and_leaves_ray_up(cluster):
    import ray

    from rlinf_like.runtime import Channel

    view = cluster.scope()
    assert view.run_id != cluster.run_id and view.devices == cluster.devices
    group = Fresh.create_group().launch(view, view.place({"run": "0-1"}), "run")
    name = view.scoped_name("results")
    channel = Channel.create(name, dict)  # held here, so only a destroy ends its store
    with view:  # what a run does at its end
        pass
    with pytest.raises(RuntimeError, match="not launched"):
        group.state()
    with pytest.raises(KeyError):
        Channel.connect(name)
    del channel
    assert ray.is_initialized()
    again = Fresh.create_group().launch(cluster, cluster.place({"next": "0-1"}), "next")  # the devices came back
    try:
        assert again.state().wait()[0]["world"] == 2
    finally:
        again.shutdown()
