"""Launch failures and dead workers, each on a fresh group (no other group holds the devices)."""

import os
import signal
import time

import pytest

from rlinf_like.runtime import Worker, WorkerDiedError, WorkerError, wait_all
from test_worker_group import Probe


class BrokenInit(Worker):
    def __init__(self):
        if self.rank == 1:
            raise RuntimeError("cannot load weights")


def test_exception_in_init_fails_launch_with_rank(cluster):
    placement = cluster.place({"broken": "0-1"})
    with pytest.raises(WorkerError) as err:
        BrokenInit.create_group().launch(cluster, placement, "broken", timeout=60)
    assert err.value.rank == 1 and "cannot load weights" in str(err.value)


def test_killed_worker_surfaces_within_seconds(cluster):
    """A rank killed while its peer waits in a collective: the caller hears about the dead rank
    at once, without waiting for the survivor's collective timeout."""
    placement = cluster.place({"victim": "0-1"})
    victim = Probe.create_group(3).launch(cluster, placement, "victim")
    try:
        pids = [i["pid"] for i in victim.identity().wait()]
        slow = victim.on_ranks(1).sleep(60)
        stuck = victim.on_ranks(0).barrier_then()  # waits for rank 1, which never arrives
        time.sleep(0.5)
        os.kill(pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerDiedError) as err:
            wait_all([stuck, slow])
        assert time.monotonic() - t0 < 10
        assert (err.value.group, err.value.rank) == ("victim", 1)
        assert "victim[rank 1]" in str(err.value)
    finally:
        victim.shutdown()
