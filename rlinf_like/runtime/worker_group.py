"""WorkerGroup: the ranks of one component, launched on a placement, called as one.

    group = MyWorker.create_group(arg).launch(cluster, placement, name="actor")
    group.train_step(batch).wait()               # every rank, results in rank order
    group.on_ranks(0).save(path).wait()          # a subset
    results = await group.train_step(batch)      # async form

`wait()` returns as soon as every rank answered, and raises as soon as any rank failed:
a worker exception becomes WorkerError (group, rank, remote traceback), a dead worker process
becomes WorkerDiedError, and a `timeout` becomes GroupTimeoutError naming the pending ranks.
A worker killed for memory (Ray's memory monitor, or a SIGKILL: most often the kernel's OOM killer) becomes a
WorkerDiedError that says so in a few lines: the group, the rank's last measured memory (the driver reads the
ranks on its node from /proc while it waits on them) and the config keys that reduce it (`launch(memory_advice=)`).
On the in-process backend (`cluster.backend=local`, runtime/local.py) the ranks run on threads of
this process and the pending results are futures; every call above behaves the same.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlinf_like.runtime import comm
from rlinf_like.runtime.cluster import Cluster
from rlinf_like.runtime.errors import GroupTimeoutError, WorkerDiedError, WorkerError
from rlinf_like.runtime.device_shares import DeviceShares
from rlinf_like.runtime.host_pool import CPU_HOST_ASK, HostKey, HostPool
from rlinf_like.runtime.local import LocalCallError, LocalHost
from rlinf_like.runtime.placement import Placement
from rlinf_like.runtime.process_memory import MemorySample, memory_kill_cause, read_memory
from rlinf_like.runtime.worker_host import WorkerContext, _WorkerHost, is_control


log = logging.getLogger(__name__)
DEATH_GRACE_S = 5.0
SAMPLE_EVERY_S = 1.0  # while a wait blocks, the memory of the ranks it waits on is read this often
# One actor class for every worker type (exported once). Ordinary calls run one at a time on the
# default thread; methods marked @control run on a second thread, so they get through while a long
# call is running.
_RemoteHost = ray.remote(concurrency_groups={"control": 1})(_WorkerHost)


def _memory_detail(cause: str, group: str, rank: int, source: WorkerGroup | None) -> str:
    sample = source.memory.get(rank) if source is not None else None
    measured = sample.describe() if sample is not None else "none (the rank is not on the driver's node)"
    advice = source.memory_advice if source is not None else ""
    return (f"{cause}. Last measured memory of {group}[rank {rank}]: {measured}." +
            (f" To give {group} less to hold: {advice}" if advice else ""))


def _convert(err: Exception, group: str, rank: int, method: str, source: WorkerGroup | None = None) -> Exception:
    if isinstance(err, LocalCallError):
        return WorkerError(group, rank, method, err.remote_traceback, err.cause)
    cause = memory_kill_cause(err)
    if cause is not None:  # Ray's dump (its advice is about Ray, not this run's config) stays out
        return WorkerDiedError(group, rank, method, _memory_detail(cause, group, rank, source), memory_kill=True)
    if isinstance(err, ray.exceptions.RayActorError):
        return WorkerDiedError(group, rank, method, str(err) or type(err).__name__)
    if isinstance(err, ray.exceptions.RayTaskError):
        cause = err.cause if isinstance(err.cause, BaseException) else None
        return WorkerError(group, rank, method, str(err), cause)
    return err


@dataclass(eq=False)  # hashable by identity, so asyncio.gather accepts it
class GroupResult:
    """Pending results of one method call on some ranks of a group."""

    group: str
    method: str
    ranks: list[int]
    refs: list  # ray.ObjectRef, or concurrent.futures.Future on the in-process backend
    source: WorkerGroup | None = field(default=None, repr=False)  # where a death's memory figures come from

    def done(self) -> bool:
        """Every rank has answered (or failed); never blocks."""
        if _is_local(self.refs):
            return all(f.done() for f in self.refs)
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def any_done(self) -> bool:
        """Some rank has answered (or failed); never blocks."""
        if _is_local(self.refs):
            return any(f.done() for f in self.refs)
        return bool(ray.wait(self.refs, timeout=0)[0])

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Results in rank order; raises on the first failing rank, without waiting for the others."""
        return wait_all([self], timeout)[0]

    async def wait_async(self) -> list[Any]:
        async def one(ref, rank: int) -> Any:
            try:
                return await (asyncio.wrap_future(ref) if isinstance(ref, concurrent.futures.Future) else ref)
            except Exception as err:
                raise _convert(err, self.group, rank, self.method, self.source) from None

        tasks = [asyncio.ensure_future(one(ref, rank)) for ref, rank in zip(self.refs, self.ranks)]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for t in tasks:
                t.cancel()

    def __await__(self):
        return self.wait_async().__await__()


def _is_local(refs: Sequence) -> bool:
    return bool(refs) and isinstance(refs[0], concurrent.futures.Future)


def wait_all(results: Sequence[GroupResult], timeout: float | None = None) -> list[list[Any]]:
    """Wait for several pending calls together; the first failure anywhere raises at once."""
    if any(_is_local(res.refs) for res in results):
        return _wait_local(results, timeout)
    owner = {ref: (res, rank) for res in results for ref, rank in zip(res.refs, res.ranks)}
    values: dict[ray.ObjectRef, Any] = {}
    pending = list(owner)
    deadline = None if timeout is None else time.monotonic() + timeout
    sampled = time.monotonic()
    while pending:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1,
                                  timeout=SAMPLE_EVERY_S if remaining is None else min(remaining, SAMPLE_EVERY_S))
        if time.monotonic() - sampled >= SAMPLE_EVERY_S:  # the last reading before a death is at most this old
            sampled = time.monotonic()
            for ref in pending:
                res, rank = owner[ref]
                if res.source is not None:
                    res.source.sample_memory(rank)
        if not ready and (deadline is None or time.monotonic() < deadline):
            continue
        if not ready:
            res, _ = owner[pending[0]]
            late = sorted(rank for ref, (r, rank) in owner.items() if r is res and ref in pending)
            raise GroupTimeoutError(res.group, res.method, late, timeout)
        ref = ready[0]
        try:
            values[ref] = ray.get(ref)
        except Exception as err:
            res, rank = owner[ref]
            first = _convert(err, res.group, rank, res.method, res.source)
            raise _root_cause(first, pending, owner) from None
    return [[values[ref] for ref in res.refs] for res in results]


def _wait_local(results: Sequence[GroupResult], timeout: float | None) -> list[list[Any]]:
    """`wait_all` over the in-process backend's futures: the same order, errors and timeouts."""
    owner = {fut: (res, rank) for res in results for fut, rank in zip(res.refs, res.ranks)}
    done, pending = concurrent.futures.wait(owner, timeout, concurrent.futures.FIRST_EXCEPTION)
    failed = [f for f in done if f.exception() is not None]
    if failed:
        res, rank = owner[failed[0]]
        raise _convert(failed[0].exception(), res.group, rank, res.method, res.source) from None
    if pending:
        res, _ = owner[next(iter(pending))]
        late = sorted(rank for fut, (r, rank) in owner.items() if r is res and fut in pending)
        raise GroupTimeoutError(res.group, res.method, late, timeout)
    return [[fut.result() for fut in res.refs] for res in results]


def _root_cause(first: Exception, pending: list, owner: dict, grace_s: float = DEATH_GRACE_S) -> Exception:
    """When one rank fails, a peer's death is often the cause (a collective sees "connection
    closed" before Ray reports the dead process). Report the death if one shows up shortly."""
    if isinstance(first, WorkerDiedError) or not pending:
        return first
    deadline = time.monotonic() + grace_s
    while pending and time.monotonic() < deadline:
        ready, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as err:
                res, rank = owner[ref]
                died = _convert(err, res.group, rank, res.method, res.source)
                died.add_note(f"meanwhile: {str(first).splitlines()[0]}")
                return died
            except Exception:
                pass
    return first


class WorkerGroup:
    def __init__(self, worker_cls: type, args: tuple, kwargs: dict):  # worker_cls: a Worker subclass
        self.worker_cls, self._args, self._kwargs = worker_cls, args, kwargs
        self.name: str = ""
        self._hosts: list[ray.actor.ActorHandle] = []
        self._ranks: list[int] = []
        self.node_ips: list[str] = []
        self.pids: list[int] = []
        self.memory_advice = ""  # the config keys that reduce this component's memory, named when it is killed for it
        self.memory: dict[int, MemorySample] = {}  # each rank's last measured memory (ranks on the driver's node)
        self._measured: set[int] = set()  # those ranks
        self.gpu_ranks: list[int] = []  # the ranks placed on a GPU (they answer `device_memory`)
        self._pool: HostPool | None = None  # cluster.reuse_workers: where shutdown leaves the rank processes
        self._keys: list[HostKey] = []
        self._shares: DeviceShares | None = None  # where this group's CPU ranks hold their shares while it runs

    # --- launch --------------------------------------------------------------------------------
    def launch(
        self,
        cluster: Cluster,
        placement: Placement,
        name: str,
        *,
        init_process_group: bool = True,
        timeout: float | None = None,
        memory_advice: str = "",
    ) -> WorkerGroup:
        """Start one Ray actor per rank of `placement[name]`, construct the workers, make the group's
        process group (eagerly, barrier-checked); everything bounded by `timeout` (default: the
        cluster's collective timeout). `memory_advice`: the config keys that reduce this component's memory,
        named when a rank is killed for memory."""
        if self._hosts:
            raise RuntimeError(f"worker group {self.name!r} is already launched")
        component = placement[name]
        cluster.check_in_process(placement, [name])
        timeout = cluster.config.collective_timeout_s if timeout is None else timeout
        self.name, self.memory_advice = name, memory_advice
        self._ranks = list(range(component.world_size))
        self.gpu_ranks = [rp.rank for rp in component.ranks if rp.device.kind == "gpu"]
        self._pool = cluster.host_pool
        if not cluster.in_process:
            cluster.device_shares.claim(self, name, component.ranks)
            self._shares = cluster.device_shares
        binds = []  # kept processes taking this group's ranks
        for rp in component.ranks:
            ctx = WorkerContext(name, rp.rank, component.world_size, rp.device, cluster.config.collective_timeout_s,
                                in_process=cluster.in_process)
            host, bind = self._start_host(cluster, rp, ctx)
            self._hosts.append(host)
            binds += [(rp.rank, bind)] if bind is not None else []
        cluster.adopt(self)
        try:
            if binds:
                GroupResult(name, "bind", [r for r, _ in binds], [b for _, b in binds], self).wait(timeout)
            info = self._call_hosts("node_info", self._ranks).wait(timeout)
            self.node_ips = [ip for ip, _ in info]
            self.pids = [pid for _, pid in info]
            if not cluster.in_process:  # in process every rank is the driver: a memory kill takes the driver too
                here = ray.util.get_node_ip_address()
                self._measured = {r for r in self._ranks if self.node_ips[r] == here}
            if init_process_group and cluster.in_process:  # one shared group of one rank: no rendezvous
                self._call_hosts("init_process_group", self._ranks, None, None).wait(timeout)
            elif init_process_group:
                host = comm.rendezvous_host(self.node_ips, self.node_ips[0])
                [port] = self._call_hosts("host_store", [0], "default", host, component.world_size).wait(timeout)
                self._call_hosts("init_process_group", self._ranks, host, port).wait(timeout)
            self._call_hosts("construct", self._ranks).wait(timeout)
            self.sample_memory(*self._ranks)
        except BaseException:
            self._end(keep=False)  # a failed launch's processes may not even have started: none is kept
            raise
        return self

    def _start_host(self, cluster: Cluster, rp, ctx: WorkerContext):
        """One rank's host: a Ray actor on the rank's reserved device (a kept one when the cluster reuses them,
        returned with its pending `bind`), or threads of this process."""
        if cluster.in_process:
            return LocalHost(_WorkerHost, self.worker_cls, ctx, self._args, self._kwargs), None
        key = HostKey(rp.device.kind, rp.device.index)
        self._keys.append(key)
        name = f"{self.name}-{rp.rank}"
        if self._pool is not None and rp.device.kind == "cpu":
            if (host := self._pool.take(key)) is not None:
                return host, host.bind.remote(self.worker_cls, ctx, self._args, self._kwargs)
            name += f"-{uuid.uuid4().hex[:6]}"  # a kept process keeps its first name: a later one needs another
        resources = {"num_gpus": rp.share, "num_cpus": 0} if rp.device.kind == "gpu" else {"num_cpus": CPU_HOST_ASK}
        return _RemoteHost.options(
            name=cluster.scoped_name(name),
            namespace=cluster.config.namespace,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                cluster.reservation(rp.device), placement_group_bundle_index=0
            ),
            max_restarts=0,
            **resources,
        ).remote(self.worker_cls, ctx, self._args, self._kwargs), None

    # --- calls -----------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return len(self._ranks)

    def _invoke(self, rank: int, host_method: str, *args: Any, control: bool = False):
        host = self._hosts[rank]
        if isinstance(host, LocalHost):
            return host.call(host_method, *args, control=control)
        return getattr(host, host_method).remote(*args)

    def _call_hosts(self, host_method: str, ranks: Sequence[int], *args: Any) -> GroupResult:
        refs = [self._invoke(r, host_method, *args) for r in ranks]
        return GroupResult(self.name, host_method, list(ranks), refs, self)

    def call(self, method: str, *args: Any, ranks: Sequence[int] | None = None, **kwargs: Any) -> GroupResult:
        """Run `method(*args, **kwargs)` on `ranks` (default: all) without waiting."""
        if not self._hosts:
            raise RuntimeError(f"worker group of {self.worker_cls.__name__} is not launched (or shut down)")
        if not callable(getattr(self.worker_cls, method, None)):
            raise AttributeError(f"{self.worker_cls.__name__} (group {self.name!r}) has no method {method!r}")
        ranks = self._ranks if ranks is None else list(ranks)
        bad = [r for r in ranks if r not in self._ranks]
        if bad:
            raise IndexError(f"worker group {self.name!r} has ranks 0-{self.world_size - 1}; asked for {bad}")
        control = is_control(self.worker_cls, method)
        execute = "execute_control" if control else "execute"
        refs = [self._invoke(r, execute, method, args, kwargs, control=control) for r in ranks]
        return GroupResult(self.name, method, ranks, refs, self)

    def sample_memory(self, *ranks: int) -> None:
        """Read these ranks' memory now (a /proc read each; ranks on other nodes are skipped)."""
        for rank in ranks:
            if rank in self._measured and (sample := read_memory(self.pids[rank])) is not None:
                self.memory[rank] = sample

    def on_ranks(self, *ranks: int) -> _RankSubset:
        return _RankSubset(self, list(ranks))

    def __getattr__(self, method: str):
        if method.startswith("_"):
            raise AttributeError(method)
        return lambda *args, **kwargs: self.call(method, *args, **kwargs)

    # --- lifetime --------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Kill every rank's process (their device shares go back to Ray), or empty it and keep it for the next
        group where the cluster reuses them; in process, end its threads once the calls already queued have run."""
        self._end(keep=True)

    def _end(self, keep: bool) -> None:
        kept = []
        for rank, handle in enumerate(self._hosts):
            if isinstance(handle, LocalHost):
                if not handle.stop():
                    log.warning("worker group %r rank %d: a call was still running at shutdown", self.name, rank)
            elif keep and self._pool is not None and self._keys[rank].kind == "cpu":
                kept.append((self._keys[rank], handle))
            else:
                ray.kill(handle, no_restart=True)
        if kept:
            self._pool.give_back(kept)
        if self._shares is not None:
            self._shares.free(self)
        self._hosts, self._keys, self._shares = [], [], None

    def actor_handles(self) -> list[ray.actor.ActorHandle]:
        return list(self._hosts)


class _RankSubset:
    def __init__(self, group: WorkerGroup, ranks: list[int]):
        self._group, self._ranks = group, ranks

    def __getattr__(self, method: str):
        return lambda *args, **kwargs: self._group.call(method, *args, ranks=self._ranks, **kwargs)


def connect_groups(
    first: WorkerGroup, second: WorkerGroup, name: str, timeout: float | None = None, backend: str | None = None
) -> None:
    """Create peer group `name` over all ranks of `first` then `second`, eagerly and barrier-checked.

    Inside a worker: `self.peer_group(name)`; peer ranks of `first` are 0..n1-1, of `second` n1.. .
    `backend` defaults to NCCL on GPU, gloo on CPU. Groups collocated on the same GPUs need "gloo":
    NCCL refuses two ranks on one device (weights then move by CUDA IPC, transport "ipc").
    """
    if backend not in (None, "gloo", "nccl"):
        raise ValueError(f"peer group {name!r}: backend {backend!r} is not one of None, 'gloo', 'nccl'")
    ranks = {
        first.name: list(range(first.world_size)),
        second.name: list(range(first.world_size, first.world_size + second.world_size)),
    }
    if first.name == second.name:
        raise ValueError(f"peer group {name!r}: both sides are group {first.name!r}")
    world_size = first.world_size + second.world_size
    host = comm.rendezvous_host(first.node_ips + second.node_ips, first.node_ips[0])
    [port] = first._call_hosts("host_store", [0], f"peer/{name}", host, world_size).wait(timeout)
    calls = [
        group._call_hosts("join_peer_group", [rank], name, host, port, ranks[group.name][rank], ranks, backend)
        for group in (first, second)
        for rank in group._ranks
    ]
    wait_all(calls, timeout)
