"""torch.distributed process groups for workers: gloo on CPU, NCCL on GPU, always with a timeout.

Two kinds, both created eagerly (at launch / when asked for) and checked with a barrier so a
broken rendezvous fails at creation, never at first use:

* the group's own group: each worker process's default group (`torch.distributed.group.WORLD`),
  so FSDP / device meshes work on it unchanged;
* a peer group spanning two worker groups (e.g. actor -> rollout weights). A process has
  only one default group, so this one is a stand-alone ProcessGroup object on its own store,
  wrapped in `PeerGroup` (ranks of the first group come first).

Rendezvous: the first rank of a group binds a TCPStore on a free port (port 0, so no race)
and reports (ip, port); the others connect to it. 127.0.0.1 when every member is on one node.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist


def backend_for(device_kind: str) -> str:
    return "nccl" if device_kind == "gpu" else "gloo"


def rendezvous_host(member_ips: list[str], store_ip: str) -> str:
    return "127.0.0.1" if all(ip == store_ip for ip in member_ips) else store_ip


def host_store(host: str, world_size: int, timeout_s: float) -> dist.TCPStore:
    """Bind a TCPStore server on a free port of this node (read it back from `.port`)."""
    return dist.TCPStore(
        host, 0, world_size, is_master=True, timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False
    )


def connect_store(host: str, port: int, world_size: int, timeout_s: float) -> dist.TCPStore:
    return dist.TCPStore(host, port, world_size, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def init_default_group(store: dist.Store, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
    dist.init_process_group(
        backend=backend,
        store=dist.PrefixStore("default/", store),
        rank=rank,
        world_size=world_size,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    dist.barrier()


_SHARED_DEFAULT = {"made": False}


def init_shared_default_group(backend: str, timeout_s: float) -> None:
    """The in-process backend's default group: one rank, made by the first group launched, shared by all."""
    if dist.is_initialized():
        if dist.get_world_size() != 1:
            raise RuntimeError(f"this process already has a default process group of {dist.get_world_size()} ranks; "
                               "the in-process backend (cluster.backend=local) needs it to have one")
        return
    dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=timeout_s))
    _SHARED_DEFAULT["made"] = True


def release_shared_default_group() -> None:
    """Destroy the in-process default group, if this module made it (the cluster shutting down)."""
    if _SHARED_DEFAULT["made"] and dist.is_initialized():
        dist.destroy_process_group()
    _SHARED_DEFAULT["made"] = False


def _make_group(store: dist.Store, rank: int, world_size: int, backend: str, timeout_s: float) -> dist.ProcessGroup:
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    return dist.ProcessGroupNCCL(store, rank, world_size, options)


@dataclass
class PeerGroup:
    """A process group over the ranks of two worker groups; `ranks[group]` are its members' peer ranks."""

    name: str
    rank: int
    world_size: int
    ranks: dict[str, list[int]]
    backend: str
    timeout_s: float
    _pg: dist.ProcessGroup
    _store: dist.Store  # keep the store (and its server on the first rank) alive with the group

    @classmethod
    def join(
        cls, name: str, store: dist.Store, rank: int, ranks: dict[str, list[int]], backend: str, timeout_s: float
    ) -> PeerGroup:
        world_size = sum(len(r) for r in ranks.values())
        pg = _make_group(dist.PrefixStore(f"peer/{name}/", store), rank, world_size, backend, timeout_s)
        group = cls(name, rank, world_size, ranks, backend, timeout_s, pg, store)
        group.barrier()
        return group

    @property
    def device(self) -> torch.device:
        """Where this group's tensors must live: the current GPU for NCCL, host memory for gloo."""
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    @property
    def store(self) -> dist.Store:
        """A key-value store private to this group (for small side-band messages)."""
        return dist.PrefixStore(f"peer/{self.name}/kv/", self._store)

    def wait(self, work, timeout_s: float | None = None) -> None:
        """Wait for a posted operation, within `timeout_s` (default: the group's timeout)."""
        work.wait(datetime.timedelta(seconds=self.timeout_s if timeout_s is None else timeout_s))

    def post_send(self, tensor: torch.Tensor, dst: int, tag: int = 0):
        """Start a send and return its work handle; many may be in flight (no ordering deadlocks)."""
        return self._pg.send([tensor], dst, tag)

    def post_recv(self, tensor: torch.Tensor, src: int, tag: int = 0):
        return self._pg.recv([tensor], src, tag)

    def broadcast(self, tensor: torch.Tensor, src: int) -> torch.Tensor:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = src, 0
        self.wait(self._pg.broadcast([tensor], opts))
        return tensor

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.wait(self._pg.allreduce([tensor]))
        return tensor

    def send(self, tensor: torch.Tensor, dst: int, tag: int = 0) -> None:
        self.wait(self.post_send(tensor, dst, tag))

    def recv(self, tensor: torch.Tensor, src: int, tag: int = 0) -> torch.Tensor:
        self.wait(self.post_recv(tensor, src, tag))
        return tensor

    def post_barrier(self):
        # An all-reduce of one element: works the same on gloo and NCCL, and honours the timeout.
        return self._pg.allreduce([torch.zeros(1, device=self.device)])

    def barrier(self) -> None:
        self.wait(self.post_barrier())

    def __reduce__(self):
        raise TypeError(f"peer group {self.name!r} lives in its worker process and cannot be pickled")
