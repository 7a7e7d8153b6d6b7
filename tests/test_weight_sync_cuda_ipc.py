"""CUDA IPC weight sync: actor and rollout processes on one GPU, control over a gloo peer group.

Runs on a GPU machine only (marked `gpu`). Two plain spawned processes (no Ray) so the test checks the
transport itself: the rollout must end up with the actor's exact bf16-rounded weights, twice (the
second round reuses the shared buffers), and the actor's GPU memory must not grow between rounds.
"""

import datetime
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlinf_like.hybrid_engines.reshard import SyncPlan, WeightReceiver, WeightSender, replicated, sharded
from rlinf_like.runtime.comm import PeerGroup

SHAPE = (256, 96)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(rank: int, port: int, results) -> None:
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    group = PeerGroup.join("w", store, rank, {"actor": [0], "rollout": [1]}, "gloo", 60)
    plan = SyncPlan.build([replicated("w", SHAPE, 1)], [sharded("w", SHAPE, 1, dim=0, dtype="torch.bfloat16")],
                          "actor", "rollout")
    torch.manual_seed(0)
    weights = torch.randn(SHAPE, device="cuda")
    if rank == 0:
        sender = WeightSender(group, plan, 0, transport="ipc")
        sender.publish(1, {"w": weights})
        torch.cuda.synchronize()
        allocated = torch.cuda.memory_allocated()
        sender.publish(2, {"w": weights * 2})
        torch.cuda.synchronize()
        results.put(("actor", torch.cuda.memory_allocated() - allocated))
    else:
        target = torch.zeros(SHAPE, dtype=torch.bfloat16, device="cuda")
        receiver = WeightReceiver(group, plan, 0, {"w": target}, transport="ipc")
        receiver.apply(1)
        first = torch.equal(target, weights.to(torch.bfloat16))
        receiver.apply(2)
        second = torch.equal(target, (weights * 2).to(torch.bfloat16))
        results.put(("rollout", (first, second)))
    group.barrier()


@pytest.mark.gpu
def test_cuda_ipc_sync_is_exact_and_reuses_buffers():
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_run, args=(rank, port, results)) for rank in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]
    got = dict(results.get(timeout=5) for _ in procs)
    assert got["rollout"] == (True, True)
    assert got["actor"] <= SHAPE[0] * SHAPE[1] * 4  # only the temporary `weights * 2`, no new buffers
