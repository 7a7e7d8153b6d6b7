"""The in-process backend (`cluster.backend=local`): every worker group's rank runs inside the driver process.

Each rank gets two daemon threads, the way a Ray actor of this package has two: a *main lane* that runs its
ordinary calls one at a time in call order, and a *control lane* for `@control` methods, so an abort or a weight
announcement still gets through while a long `serve` call runs. Calls return `concurrent.futures.Future`s that
`GroupResult` waits on exactly as it waits on Ray's object refs, and a method that raises arrives as `WorkerError`
naming the group and rank, with the worker's traceback.

Arguments and results cross a lane as a copy (cloudpickle, as Ray serializes them), so a worker that changes an
argument in place changes its own copy, never the driver's.

The ranks share what a process has once: torch's, numpy's and `random`'s global generators. So a worker that
samples draws from a generator of its own and touches the global ones only while it is built (groups launch one
after another); the package's workers do, and a run computes the numbers it computes on Ray, bit for bit. Two ranks
drawing from the global generators at the same time would share them here.

Why one rank per group: `torch.distributed` has one default process group per process, and a rank's own group
(FSDP's mesh) is that default group. Every world-size-1 group shares one default group of size 1 in this process
(a collective over one rank is the identity). Peer groups between two groups (the weight sync) are real gloo
groups whose two ranks live on two lanes of this process. More ranks per group need processes: cluster.backend=ray.

What it is for: a breakpoint in a worker method stops the whole run in one debugger (pdb, an IDE), and tests run a
whole schedule without starting Ray or worker processes.
"""

from __future__ import annotations

import gc
import queue
import threading
import traceback
from concurrent.futures import Future
from typing import Any, Callable

import ray.cloudpickle as cloudpickle

_STOP = object()


def copy(value: Any) -> Any:
    """What the other side of a Ray call receives: a deep copy through cloudpickle."""
    return cloudpickle.loads(cloudpickle.dumps(value))


class LocalCallError(Exception):
    """A worker method raised on a lane; carries the formatted traceback the driver shows (as Ray's does)."""

    def __init__(self, cause: BaseException, remote_traceback: str):
        super().__init__(remote_traceback)
        self.cause, self.remote_traceback = cause, remote_traceback


class Lane:
    """One daemon thread running submitted calls in order (daemon: a serve loop left running never blocks exit)."""

    def __init__(self, name: str):
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        self._queue.put((fn, future))
        return future

    def _run(self) -> None:
        while (item := self._queue.get()) is not _STOP:
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn()
            except BaseException as err:  # noqa: BLE001 - every failure goes back to the caller
                future.set_exception(LocalCallError(err, traceback.format_exc()))
            else:
                future.set_result(result)

    def stop(self) -> None:
        self._queue.put(_STOP)

    def join(self, timeout: float) -> bool:
        """Wait for the lane's thread to end; False if a call still runs after `timeout` seconds."""
        self._thread.join(timeout)
        return not self._thread.is_alive()


class LocalHost:
    """One rank in this process: its `_WorkerHost` (the same object a Ray actor holds) and its two lanes."""

    def __init__(self, host_cls: type, worker_cls: type, ctx: Any, args: tuple, kwargs: dict):
        name = f"{ctx.group_name}-{ctx.rank}"
        self.main, self.control = Lane(name), Lane(f"{name}-control")
        self._host: Any = None
        args, kwargs = copy((args, kwargs))

        def build() -> None:
            self._host = host_cls(worker_cls, ctx, args, kwargs)

        self.main.submit(build)

    def call(self, host_method: str, *args: Any, control: bool = False) -> Future:
        """Run `host_method(*args)` of the rank's host on its lane; arguments and result copied as Ray would."""
        args = copy(args)

        def run() -> Any:
            return copy(getattr(self._host, host_method)(*args))

        return (self.control if control else self.main).submit(run)

    def stop(self, timeout: float = 10.0) -> bool:
        """End both lanes after the calls already queued and wait for them (a thread still inside torch when the
        interpreter exits can crash it); drops the worker so its memory goes with it. False if a call (e.g. a serve
        loop nobody stopped) still runs after `timeout` seconds: its daemon thread is then left behind."""

        def drop() -> None:
            self._host = None
            gc.collect()  # its process groups and stores end here, not in the interpreter's exit

        self.main.submit(drop)
        self.main.stop()
        self.control.stop()
        return self.main.join(timeout) and self.control.join(timeout)


# --- the one in-process cluster of this process, and its channels ------------------------------------------------
_ACTIVE: dict[str, Any] = {"cluster": None, "channels": {}}


def claim_process(cluster: Any) -> None:
    """Make `cluster` this process's in-process cluster (one at a time, as Ray allows one connection)."""
    if _ACTIVE["cluster"] is not None:
        raise RuntimeError("an in-process cluster (cluster.backend=local) is already running in this process; "
                           "shut it down first")
    _ACTIVE["cluster"] = cluster


def owner() -> Any:
    return _ACTIVE["cluster"]


def release_process(cluster: Any) -> None:
    """The cluster is shutting down: its channels' stores go with it."""
    if _ACTIVE["cluster"] is cluster:
        for store in _ACTIVE["channels"].values():
            store.discard()
            store.shutdown()
        _ACTIVE["channels"].clear()
        _ACTIVE["cluster"] = None


def register_channel(name: str, store: Any) -> None:
    if name in _ACTIVE["channels"]:
        raise ValueError(f"a channel named {name!r} already exists; use Channel.connect({name!r})")
    _ACTIVE["channels"][name] = store


def find_channel(name: str) -> Any:
    if name not in _ACTIVE["channels"]:
        raise KeyError(f"no channel named {name!r}")
    return _ACTIVE["channels"][name]


def forget_channel(name: str) -> None:
    _ACTIVE["channels"].pop(name, None)
