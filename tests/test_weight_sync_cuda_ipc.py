"""The `ipc` weight-sync transport (CUDA IPC on a GPU), control over a gloo peer group.

Two plain spawned processes (no Ray) on one GPU, marked `gpu`, so the test checks the transport itself: the
rollout must end up with the actor's exact bf16-rounded weights, twice (the second round reuses the shared
buffers), and the actor's GPU memory must not grow between rounds.

Then both endpoints in one process, as the in-process backend places them: CUDA will not open an IPC handle in the
process that made it, so a receiver in the sender's process must take the sender's buffer itself instead of opening
its handle. On CPU the test checks that the same object is handed over (a tensor rebuilt from its handle would be a
second object); on a GPU (marked `gpu`), that the round works.
"""

import datetime
import socket
import threading

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


def _plan() -> SyncPlan:
    return SyncPlan.build([replicated("w", SHAPE, 1)], [sharded("w", SHAPE, 1, dim=0, dtype="torch.bfloat16")],
                          "actor", "rollout")


def _join(rank: int, port: int) -> PeerGroup:
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0, timeout=datetime.timedelta(seconds=60))
    return PeerGroup.join("w", store, rank, {"actor": [0], "rollout": [1]}, "gloo", 60)


def _run(rank: int, port: int, results) -> None:
    group, plan = _join(rank, port), _plan()
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


# --- both endpoints in one process (the in-process backend) ----------------------------------------------------
def _sync_twice_in_one_process(device: str):
    port, out, errors, plan = _free_port(), {}, [], _plan()
    weights = torch.randn(SHAPE, generator=torch.Generator().manual_seed(0)).to(device)

    def rank(r: int) -> None:
        try:
            group = _join(r, port)
            if r == 0:
                sender = WeightSender(group, plan, 0, transport="ipc")
                for version, scale in ((1, 1), (2, 2)):
                    sender.publish(version, {"w": weights * scale})
                out["sent"] = [buffer for buffer, _ in sender.transport._handles.values()]
            else:
                target = torch.zeros(SHAPE, dtype=torch.bfloat16, device=device)
                receiver = WeightReceiver(group, plan, 0, {"w": target}, transport="ipc")
                out["exact"] = []
                for version, scale in ((1, 1), (2, 2)):
                    receiver.apply(version)
                    out["exact"].append(torch.equal(target, (weights * scale).to(torch.bfloat16)))
                out["opened"] = [buffer for _, buffer in receiver.transport._opened.values()]
            group.barrier()
        except BaseException as err:  # surfaced by the test thread
            errors.append(err)

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return out


def test_ipc_in_one_process_hands_over_the_senders_buffer():
    out = _sync_twice_in_one_process("cpu")
    assert out["exact"] == [True, True]
    assert len(out["opened"]) == len(out["sent"]) > 0
    assert all(any(o is s for s in out["sent"]) for o in out["opened"])  # the object itself, no handle opened


@pytest.mark.gpu
def test_cuda_ipc_in_one_process_syncs_exactly():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    assert _sync_twice_in_one_process("cuda")["exact"] == [True, True]
