"""Cluster: an explicit handle on a Ray instance (started here or joined), its nodes and devices.

Not a process-wide singleton: make one, pass it around, shut it down (or use `with`).
Devices are reserved lazily, one single-bundle placement group per device pinned to its node,
so workers always go through Ray's resource accounting.

`backend="local"` starts no Ray: every worker group runs its one rank on threads of this process
(runtime/local.py), behind the same WorkerGroup calls, futures, errors and channels, for a debugger
that steps through a whole run and for tests that need no worker processes.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
import sysconfig
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from rlinf_like.runtime import comm, local
from rlinf_like.runtime.device_shares import DeviceShares
from rlinf_like.runtime.errors import PlacementError
from rlinf_like.runtime.host_pool import HostPool
from rlinf_like.runtime.placement import Device, Placement, plan_placement

log = logging.getLogger(__name__)

# Every Ray worker process of the job inherits these.
WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
NODE_ID_LABEL = "ray.io/node-id"


@dataclass(kw_only=True)
class ClusterConfig:
    # ray: each worker rank is a Ray actor process. local: no Ray; every worker group runs in this process, one
    # rank per group, for pdb through a whole step and for fast tests
    backend: Literal["ray", "local"] = "ray"
    address: str | None = None  # None: $RAY_ADDRESS if set, else start a local Ray instance
    num_cpus: int | None = None  # only for a local instance; None: all of this machine's CPUs
    num_gpus: int | None = None  # only for a local instance
    object_store_memory_mb: int | None = 600  # only for a local instance
    num_nodes: int | None = None  # expected nodes of a joined cluster: wait up to reserve_timeout_s for them
    namespace: str = "rlinf_like"  # the Ray namespace this run's named actors live in
    collective_timeout_s: float = 300.0  # every torch.distributed group and collective
    reserve_timeout_s: float = 60.0  # waiting for Ray to grant a device
    # keep a shut-down group's rank processes and hand them to the next group launched on the same device, their
    # imports done (~3 s of CPU a rank on 2 cores; runtime/host_pool.py). For a driver that launches
    # many groups (tests, sweeps, a server); a run that launches each group once gains nothing. CPU ranks only
    reuse_workers: bool = False
    env_vars: dict[str, str] = field(default_factory=dict)  # forwarded to every worker
    # component -> device range, one key per component (collocation follows from overlapping ranges);
    # grammar in runtime/placement.py. Override one: cluster.component_placement.actor=0-1
    component_placement: dict[str, str] = field(default_factory=dict)


def _driver_pythonpath() -> str:
    """The driver's own source directories (cwd, script and test folders, not installed packages),
    so worker classes defined in a script or test module import inside Ray workers too."""
    installed = {*sysconfig.get_paths().values(), sys.prefix, sys.base_prefix, sys.exec_prefix}
    paths = [os.getcwd()]
    for p in sys.path:
        p = os.path.abspath(p or os.getcwd())
        if os.path.isdir(p) and not any(p.startswith(i) for i in installed) and p not in paths:
            paths.append(p)
    paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]
    return os.pathsep.join(paths)


def _spec_of(spec: Mapping[str, str], component: str, placement: Placement) -> str:
    """The device range the config's component_placement gives `component` (its key may name several components),
    else the devices it was placed on."""
    given = (v for k, v in spec.items() if component in [c.strip() for c in k.split(",")])
    return next(given, ",".join(str(r.device.index) for r in placement[component].ranks))


def this_machine(config: ClusterConfig) -> NodeInfo:
    """This machine as a one-node cluster would see it: the config's CPU and GPU counts, else what it has."""
    num_gpus = config.num_gpus
    if num_gpus is None:
        try:
            import torch

            num_gpus = torch.cuda.device_count()
        except ImportError:
            num_gpus = 0
    return NodeInfo(rank=0, node_id="local", ip="127.0.0.1", num_cpus=config.num_cpus or os.cpu_count() or 1,
                    num_gpus=num_gpus, is_head=True)


def devices_of(config: ClusterConfig) -> dict[str, list[Device]]:
    """The devices a local cluster of `config` has, without starting one (for checks before any worker starts)."""
    return Cluster._enumerate_devices([this_machine(config)])


@dataclass(frozen=True)
class NodeInfo:
    rank: int
    node_id: str
    ip: str
    num_cpus: int
    num_gpus: int
    is_head: bool


class Cluster:
    def __init__(self, config: ClusterConfig | None = None, **overrides):
        self.config = config or ClusterConfig(**overrides)
        self._reservations: dict[tuple[str, int], PlacementGroup] = {}
        self.run_id = uuid.uuid4().hex[:8]
        self.host_pool = HostPool() if self.config.reuse_workers and not self.in_process else None
        self.device_shares = DeviceShares()  # shared with `scope()` views, as the devices are
        self._parent: Cluster | None = None  # set on a `scope()` view: the cluster it borrows
        if self.in_process:
            self._start_in_process()
            return
        if ray.is_initialized():
            raise RuntimeError(
                "Ray is already initialized in this process; a Cluster owns its Ray connection. "
                "Shut the other Cluster (or ray.shutdown()) down first."
            )
        address = self.config.address or os.environ.get("RAY_ADDRESS")
        env_vars = {**WORKER_ENV, "PYTHONPATH": _driver_pythonpath(), **self.config.env_vars}
        init_kwargs: dict = dict(
            namespace=self.config.namespace,
            runtime_env={"env_vars": env_vars},
            log_to_driver=True,
            logging_level=logging.WARNING,
        )
        if address:
            init_kwargs["address"] = address
        else:
            init_kwargs.update(
                # "local": always a new instance, never the last `ray start` cluster recorded in /tmp/ray
                address="local",
                num_cpus=self.config.num_cpus,
                num_gpus=self.config.num_gpus,
                include_dashboard=False,
                object_store_memory=(
                    self.config.object_store_memory_mb * 2**20 if self.config.object_store_memory_mb else None
                ),
            )
        self.is_local = not address
        ray.init(**init_kwargs)
        # run_id names this driver's actors and placement groups, so that two runs can share one Ray cluster
        self.nodes = self._wait_for_nodes()
        self.devices = self._enumerate_devices(self.nodes)
        log.info("cluster: %s", self.describe())

    @property
    def in_process(self) -> bool:
        return self.config.backend == "local"

    def _start_in_process(self) -> None:
        c = self.config
        if c.address or c.num_nodes not in (None, 1):
            raise ValueError(f"cluster.backend=local runs in this process on this machine: cluster.address="
                             f"{c.address} and cluster.num_nodes={c.num_nodes} need cluster.backend=ray")
        local.claim_process(self)
        self.is_local = True
        self._groups: list = []
        self.nodes = [this_machine(c)]
        self.devices = self._enumerate_devices(self.nodes)
        log.info("cluster: in process (cluster.backend=local), %s", self.describe())

    def adopt(self, group) -> None:
        """A worker group launched in process, or through a `scope()` view: the cluster ends it at shutdown, as
        ray.shutdown would."""
        if self.in_process or self._parent is not None:
            self._groups.append(group)

    def scope(self) -> Cluster:
        """A view of this cluster for one run on it (`train(cfg, cluster=...)`, a sweep's runs one after another):
        the same Ray connection, devices, reservations and kept worker processes, names of its own; its `shutdown`
        ends what was launched through it (worker groups, channels) and leaves Ray running."""
        if self.in_process:
            raise ValueError("cluster.backend=local holds one run at a time: start the run without a cluster")
        view = copy.copy(self)
        view.run_id, view._parent, view._groups = uuid.uuid4().hex[:8], self, []
        return view

    # --- topology -------------------------------------------------------------------------
    def _wait_for_nodes(self) -> list[NodeInfo]:
        """The alive nodes, after waiting for `num_nodes` of them (workers may still be joining)."""
        expected = self.config.num_nodes
        deadline = time.monotonic() + self.config.reserve_timeout_s
        nodes = self._read_nodes()
        while expected is not None and len(nodes) < expected:
            if time.monotonic() > deadline:
                ray.shutdown()
                raise RuntimeError(
                    f"cluster.num_nodes={expected}, but only {len(nodes)} node(s) joined within "
                    f"{self.config.reserve_timeout_s:g}s: " + ", ".join(n.ip for n in nodes))
            time.sleep(1)
            nodes = self._read_nodes()
        return nodes

    @staticmethod
    def _read_nodes() -> list[NodeInfo]:
        alive = [n for n in ray.nodes() if n["Alive"]]
        head_first = sorted(
            alive,
            key=lambda n: ("node:__internal_head__" not in n["Resources"], n["NodeManagerAddress"], n["NodeID"]),
        )
        return [
            NodeInfo(
                rank=i,
                node_id=n["NodeID"],
                ip=n["NodeManagerAddress"],
                num_cpus=int(n["Resources"].get("CPU", 0)),
                num_gpus=int(n["Resources"].get("GPU", 0)),
                is_head="node:__internal_head__" in n["Resources"],
            )
            for i, n in enumerate(head_first)
        ]

    @staticmethod
    def _enumerate_devices(nodes: list[NodeInfo]) -> dict[str, list[Device]]:
        devices: dict[str, list[Device]] = {"gpu": [], "cpu": []}
        for node in nodes:
            for kind, count in (("gpu", node.num_gpus), ("cpu", node.num_cpus)):
                for _ in range(count):
                    devices[kind].append(
                        Device(kind, len(devices[kind]), node.rank, node.node_id, node.ip)
                    )
        return devices

    @property
    def num_cpus(self) -> int:
        return sum(n.num_cpus for n in self.nodes)

    @property
    def num_gpus(self) -> int:
        return sum(n.num_gpus for n in self.nodes)

    def describe(self) -> str:
        parts = [f"{n.ip}({'head, ' if n.is_head else ''}{n.num_cpus} CPU, {n.num_gpus} GPU)" for n in self.nodes]
        return f"{len(self.nodes)} node(s): " + ", ".join(parts)

    def place(
        self, component_placement: Mapping[str, str] | None = None, known_components: Iterable[str] | None = None
    ) -> Placement:
        """Plan a placement on this cluster's devices (grammar in runtime/placement.py);
        by default the config's `component_placement`."""
        spec = self.config.component_placement if component_placement is None else component_placement
        return plan_placement(spec, self.devices, known_components)

    def check_in_process(self, placement: Placement, components: Iterable[str]) -> None:
        """In process, each launched component has one rank: refuse wider ones by key, before any worker starts."""
        wide = {n: placement[n].world_size for n in components if n in placement and placement[n].world_size > 1}
        if self.in_process and wide:
            spec = self.config.component_placement
            keys = ", ".join(f"cluster.component_placement.{n}={_spec_of(spec, n, placement)} ({size} ranks)"
                             for n, size in wide.items())
            raise PlacementError(f"cluster.backend=local runs one rank per worker group in this process; {keys}: "
                                 f"place each on one device (e.g. =0), or use cluster.backend=ray")

    def scoped_name(self, name: str) -> str:
        """`name` made unique to this run, for the Ray actors (workers, channels) it names in the
        namespace that other runs on the same Ray cluster share."""
        return f"{name}-{self.run_id}"

    # --- device reservations --------------------------------------------------------------
    def reservation(self, device: Device) -> PlacementGroup:
        """The placement group holding `device`; created (and waited for) on first use."""
        key = (device.kind, device.index)
        if key not in self._reservations:
            bundle = {"GPU": 1.0} if device.kind == "gpu" else {"CPU": 1.0}
            pg = placement_group(
                [bundle],
                strategy="STRICT_PACK",
                name=f"{self.config.namespace}-{self.run_id}-{device.kind}{device.index}",
                bundle_label_selector=[{NODE_ID_LABEL: device.node_id}],
            )
            try:
                ray.get(pg.ready(), timeout=self.config.reserve_timeout_s)
            except ray.exceptions.GetTimeoutError:
                remove_placement_group(pg)
                raise TimeoutError(
                    f"Ray did not grant {device.kind} device {device.index} (node {device.node_ip}) within "
                    f"{self.config.reserve_timeout_s:g}s; available resources: {ray.available_resources()}"
                ) from None
            self._reservations[key] = pg
        return self._reservations[key]

    def release_reservations(self) -> None:
        if self.host_pool is not None:  # kept processes live in the reservations
            self.host_pool.clear()
        for pg in self._reservations.values():
            remove_placement_group(pg)
        self._reservations.clear()

    # --- lifetime ---------------------------------------------------------------------------
    def shutdown(self) -> None:
        if self._parent is not None:
            self._end_view()
            return
        if self.in_process:
            if local.owner() is self:
                for group in self._groups:
                    group.shutdown()
                self._groups.clear()
                local.release_process(self)
                comm.release_shared_default_group()
            return
        if not ray.is_initialized():
            return
        self.release_reservations()
        ray.shutdown()

    def _end_view(self) -> None:
        from rlinf_like.runtime.channel import destroy_scoped

        for group in self._groups:
            group.shutdown()
        self._groups.clear()
        destroy_scoped(self.scoped_name(""))  # the channels the run named through this view

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
