"""The Ray actor behind each worker rank, and what it shares with `Worker` and `WorkerGroup` (a leaf:
both import it, neither imports the other through it)."""

from __future__ import annotations

import gc
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any

import ray

from rlinf_like.runtime import comm
from rlinf_like.runtime.placement import Device
from rlinf_like.utils.logging import setup_logging
from rlinf_like.utils.threads import limit_threads


# run by `_WorkerHost.release` before it looks for threads left running: each ends a process-wide helper thread that
# a module starts once and keeps (tqdm's monitor, the reward worker's call threads), which a new process has not
_RELEASE_HOOKS: list = []


def on_release(hook):
    """Register `hook()` to run when a kept process is emptied for the next group (cluster.reuse_workers)."""
    if hook not in _RELEASE_HOOKS:
        _RELEASE_HOOKS.append(hook)
    return hook


@dataclass(frozen=True)
class WorkerContext:
    group_name: str
    rank: int
    world_size: int
    device: Device
    collective_timeout_s: float
    in_process: bool = False  # cluster.backend=local: a thread of the driver process, not a Ray actor


def control(method):
    """Mark a Worker method to run on the worker's control thread, so it can be called while another
    call (e.g. a long `generate`) is still running — for abort, progress and health checks. Control
    methods must be thread-safe (set a flag, read a counter)."""
    method._rlinf_control = True
    return method


def is_control(worker_cls: type, method: str) -> bool:
    return bool(getattr(getattr(worker_cls, method, None), "_rlinf_control", False))


class _WorkerHost:
    """The Ray actor behind one rank: builds the user's Worker and runs its methods.

    Keeping this generic (rather than decorating each Worker subclass) gives one place for
    rendezvous, thread limits and error context, and keeps user classes plain Python.
    """

    def __init__(self, worker_cls: type, ctx: WorkerContext, args: tuple, kwargs: dict):
        limit_threads()
        setup_logging()  # a worker's log lines reach the driver's console through Ray, as its prints do
        # what `release` restores for the next worker this process hosts (cluster.reuse_workers)
        self._fresh = (dict(os.environ), list(sys.path), os.getcwd(), {id(t) for t in threading.enumerate()})
        self.bind(worker_cls, ctx, args, kwargs)

    def bind(self, worker_cls: type, ctx: WorkerContext, args: tuple, kwargs: dict) -> None:
        """Take one rank of a group: the context now, the Worker's own __init__ at `construct`."""
        if ctx.device.kind == "gpu":
            import torch

            # a Ray worker sees only its own GPU (CUDA_VISIBLE_DEVICES); in process every GPU is visible
            torch.cuda.set_device(ctx.device.index if ctx.in_process else 0)
        self._ctx = ctx
        self._stores: dict[str, Any] = {}
        # Bind the context before __init__ so subclasses can use self.rank there without super().
        self.worker = worker_cls.__new__(worker_cls)
        self.worker._ctx = ctx
        self.worker._peer_groups = {}
        self._args, self._kwargs = args, kwargs

    def release(self) -> str | None:
        """Drop the worker, its process groups and what it changed in the process, so that this process can host a
        rank of the next group launched on its device (cluster.reuse_workers): its imports are done, which is most
        of a worker's start-up. Returns None when the process is as good as a new one, else why it is not (the
        caller then ends it): a GPU rank (CUDA state), or a thread or child process the worker left running."""
        if self._ctx.device.kind == "gpu":
            return "a GPU rank"
        import torch
        import torch.distributed as dist

        if (ps := sys.modules.get("megatron.core.parallel_state")) is not None and ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
        self.worker = None
        self._stores.clear()
        gc.collect()
        env, path, cwd, threads = self._fresh
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path
        os.chdir(cwd)
        torch.set_default_dtype(torch.float32)
        torch.set_grad_enabled(True)
        torch.seed()  # a seed from the OS, as a new process's global generator starts from
        limit_threads()
        for hook in _RELEASE_HOOKS:
            hook()
        # threads Ray runs Python on (its concurrency groups) are "dummy" threads; a worker's own are not
        left = [t.name for t in threading.enumerate()
                if id(t) not in threads and t.is_alive() and not isinstance(t, threading._DummyThread)]
        if left:
            return f"threads left running: {left}"
        try:
            import psutil
        except ImportError:
            return "psutil is missing, so child processes cannot be seen"
        if children := psutil.Process().children():
            return f"child processes left running: {[c.pid for c in children]}"
        return None

    def construct(self) -> None:
        self.worker.__init__(*self._args, **self._kwargs)
        del self._args, self._kwargs

    def node_info(self) -> tuple[str, int]:
        return ("127.0.0.1" if self._ctx.in_process else ray.util.get_node_ip_address()), os.getpid()

    def host_store(self, key: str, host: str, world_size: int) -> int:
        store = comm.host_store(host, world_size, self._ctx.collective_timeout_s)
        self._stores[key] = store
        return store.port

    def _store(self, key: str, host: str, port: int, world_size: int):
        if key in self._stores:
            return self._stores.pop(key)
        return comm.connect_store(host, port, world_size, self._ctx.collective_timeout_s)

    def init_process_group(self, host: str | None, port: int | None) -> None:
        """Join the group's default group at the rendezvous `host:port`; in process (no rendezvous), the one
        default group every world-size-1 group of the process shares."""
        ctx = self._ctx
        if ctx.in_process:
            comm.init_shared_default_group(comm.backend_for(ctx.device.kind), ctx.collective_timeout_s)
            return
        store = self._store("default", host, port, ctx.world_size)
        comm.init_default_group(
            store, ctx.rank, ctx.world_size, comm.backend_for(ctx.device.kind), ctx.collective_timeout_s
        )

    def join_peer_group(
        self, name: str, host: str, port: int, rank: int, ranks: dict[str, list[int]], backend: str | None
    ) -> None:
        world_size = sum(len(r) for r in ranks.values())
        store = self._store(f"peer/{name}", host, port, world_size)
        backend = backend or comm.backend_for(self._ctx.device.kind)
        self.worker._peer_groups[name] = comm.PeerGroup.join(
            name, store, rank, ranks, backend, self._ctx.collective_timeout_s
        )

    def execute(self, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)

    @ray.method(concurrency_group="control")
    def execute_control(self, method: str, args: tuple, kwargs: dict) -> Any:
        return getattr(self.worker, method)(*args, **kwargs)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized() and not self._ctx.in_process:  # in process the cluster owns the default group
            dist.destroy_process_group()


@on_release
def _end_tqdm_monitor() -> None:
    """tqdm starts one monitor thread for the whole process at its first progress bar (on the bar's class, often a
    subclass such as tqdm.auto's) and keeps it running; ended here, a kept process is as a new one, whose next bar
    starts a monitor again."""
    if (monitor := sys.modules.get("tqdm._monitor")) is None:
        return
    for thread in threading.enumerate():
        if isinstance(thread, monitor.TMonitor):
            thread.exit()
            if thread.tqdm_cls.monitor is thread:
                thread.tqdm_cls.monitor = None
