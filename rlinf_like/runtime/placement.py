"""Map each component's ranks to devices, from a small config grammar.

    component_placement:          # one key per component, so each is a command-line override:
      actor: "0-3"                #   cluster.component_placement.actor=0-3
      rollout: "0-3"              # the same devices as the actor: collocated, one rank per device
      reward: "all"               # every device of the default kind
      env: "cpu:0-1"              # env on CPU slots 0..1 (on a GPU cluster, where devices are GPUs)
      env: "cpu:0-1*4"            # (or) 4 ranks on each of CPU slots 0..1 (8 ranks: 0-3 on slot 0, 4-7 on slot 1)

A key may also name several components ("actor,rollout": "0-3", the same as one key each), but
hydra's override grammar cannot address such a key, so presets use one key per component.

Devices are numbered globally, node by node (head node first). On a cluster without GPUs
the default kind is "cpu" and a device is one CPU slot. Each rank asks Ray for its share of
a device: 1 / (number of ranks placed on that device), so collocated ranks split it.

The mode is derived, never configured: collocated (all components on the same device set),
disaggregated (pairwise disjoint), hybrid (anything else).
"""

from __future__ import annotations

import enum
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from rlinf_like.runtime.errors import PlacementError

DEVICE_KINDS = ("gpu", "cpu")


@dataclass(frozen=True)
class Device:
    """One schedulable device: a GPU, or on CPU-only nodes (or with the `cpu:` prefix) a CPU slot."""

    kind: str  # "gpu" | "cpu"
    index: int  # global index among devices of this kind
    node_rank: int
    node_id: str
    node_ip: str


@dataclass(frozen=True)
class RankPlacement:
    rank: int
    device: Device
    share: float  # fraction of the device this rank holds (Ray counts a GPU's; runtime/device_shares.py a CPU's)


@dataclass(frozen=True)
class ComponentPlacement:
    name: str
    ranks: tuple[RankPlacement, ...]

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def device_kind(self) -> str:
        return self.ranks[0].device.kind

    @property
    def devices(self) -> frozenset[tuple[str, int]]:
        return frozenset((r.device.kind, r.device.index) for r in self.ranks)


class PlacementMode(enum.Enum):
    COLLOCATED = "collocated"
    DISAGGREGATED = "disaggregated"
    HYBRID = "hybrid"


def relation(a: ComponentPlacement, b: ComponentPlacement) -> PlacementMode:
    if a.devices == b.devices:
        return PlacementMode.COLLOCATED
    if not a.devices & b.devices:
        return PlacementMode.DISAGGREGATED
    return PlacementMode.HYBRID


@dataclass(frozen=True)
class Placement:
    components: Mapping[str, ComponentPlacement]

    def __getitem__(self, name: str) -> ComponentPlacement:
        if name not in self.components:
            raise PlacementError(
                f"component {name!r} has no placement; placed components: {sorted(self.components)}"
            )
        return self.components[name]

    def __contains__(self, name: str) -> bool:
        return name in self.components

    def relation(self, a: str, b: str) -> PlacementMode:
        return relation(self[a], self[b])

    def weight_link(self, a: str, b: str) -> tuple[str | None, str]:
        """(peer-group backend, weight-sync transport) from component `a` to `b`. NCCL refuses two ranks on one
        GPU, so components sharing a GPU rendezvous over gloo and move weights by CUDA IPC. Components on
        different device kinds (a GPU actor, a CPU rollout) meet over gloo, staging through host memory: each
        side left to its own kind's backend would rendezvous NCCL against gloo and never meet. All others take
        their device kind's backend (None) and send over the group."""
        pa, pb = self[a], self[b]
        if pa.device_kind == pb.device_kind == "gpu" and pa.devices & pb.devices:
            return "gloo", "ipc"
        if pa.device_kind != pb.device_kind:
            return "gloo", "group"
        return None, "group"

    @property
    def mode(self) -> PlacementMode:
        comps = list(self.components.values())
        pairs = [relation(a, b) for i, a in enumerate(comps) for b in comps[i + 1 :]]
        if all(p is PlacementMode.COLLOCATED for p in pairs):
            return PlacementMode.COLLOCATED
        if all(p is PlacementMode.DISAGGREGATED for p in pairs):
            return PlacementMode.DISAGGREGATED
        return PlacementMode.HYBRID

    def describe(self) -> str:
        lines = [f"placement mode: {self.mode.value}"]
        for c in self.components.values():
            idx = [r.device.index for r in c.ranks]
            nodes = sorted({r.device.node_rank for r in c.ranks})
            lines.append(f"  {c.name}: {c.world_size} ranks on {c.device_kind} {idx} of node(s) {nodes} "
                         f"(share {c.ranks[0].share:g})")
        return "\n".join(lines)


_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def split_device_kind(text: str, component: str) -> tuple[str | None, str]:
    """"cpu:0-1" -> ("cpu", "0-1"); "0-1" -> (None, "0-1")."""
    body = str(text).strip()
    if ":" not in body:
        return None, body
    kind, body = (s.strip() for s in body.split(":", 1))
    if kind not in DEVICE_KINDS:
        raise PlacementError(
            f"component {component!r}: device kind {kind!r} in {text!r} is not one of {list(DEVICE_KINDS)}"
        )
    return kind, body


def split_ranks_per_device(text: str, component: str) -> tuple[str, int]:
    """"0-1*4" -> ("0-1", 4); "0-1" -> ("0-1", 1)."""
    body, sep, count = str(text).partition("*")
    if not sep:
        return body, 1
    if not count.strip().isdigit() or int(count) < 1:
        raise PlacementError(f"component {component!r}: ranks per device in {text!r} must be a positive integer")
    return body, int(count)


def component_names(key: str) -> list[str]:
    """The components a placement key names: "actor" or, collocated in YAML, "actor,rollout"."""
    return [n.strip() for n in str(key).split(",")]


def parse_device_range(text: str, num_devices: int, component: str) -> list[int]:
    """Parse "all | 0-3 | 0,2,5-6" (no kind prefix, no *N) into sorted device indices."""
    body = str(text).strip()
    if body == "all":
        return list(range(num_devices))
    indices: list[int] = []
    for part in body.split(","):
        m = _RANGE.match(part)
        if not m:
            raise PlacementError(
                f"component {component!r}: cannot parse device range {text!r}; "
                "expected 'all', 'N', 'N-M' or a comma list of those"
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise PlacementError(f"component {component!r}: range {part.strip()!r} in {text!r} is descending")
        indices.extend(range(lo, hi + 1))
    duplicated = sorted(i for i, n in Counter(indices).items() if n > 1)
    if duplicated:
        raise PlacementError(f"component {component!r}: range {text!r} lists devices {duplicated} twice")
    return sorted(indices)


def plan_placement(
    spec: Mapping[str, str],
    devices: Mapping[str, list[Device]],
    known_components: Iterable[str] | None = None,
) -> Placement:
    """Turn a component_placement mapping into a Placement over the cluster's devices.

    `devices` maps a kind ("gpu"/"cpu") to that kind's devices in global order; the default
    kind is "gpu" when the cluster has GPUs, else "cpu".
    `known_components`, when given, is the set of component names a runner understands.
    """
    known = set(known_components) if known_components is not None else None
    default_kind = "gpu" if devices.get("gpu") else "cpu"
    assigned: dict[str, tuple[str, list[int], str]] = {}
    for key, value in spec.items():
        names = component_names(key)
        if any(not n for n in names):
            raise PlacementError(f"placement key {key!r} has an empty component name")
        for name in names:
            if known is not None and name not in known:
                raise PlacementError(
                    f"unknown component {name!r} in placement key {key!r}; known components: {sorted(known)}"
                )
            if name in assigned:
                raise PlacementError(
                    f"component {name!r} is placed twice: {assigned[name][2]!r} and {value!r} (key {key!r})"
                )
            kind, body = split_device_kind(value, name)
            body, per_device = split_ranks_per_device(body, name)
            kind = kind or default_kind
            pool = devices.get(kind, [])
            indices = parse_device_range(body, len(pool), name)
            if not indices:
                raise PlacementError(f"component {name!r}: range {value!r} selects no {kind} devices")
            out_of_range = [i for i in indices if i >= len(pool)]
            if out_of_range:
                where = f"cluster.component_placement.{key}={value!r} (component {name!r})"
                raise PlacementError(
                    f"{where} uses {kind} devices {_ranges(out_of_range)}, but the cluster has {len(pool)} {kind} "
                    f"device(s) (valid: 0-{len(pool) - 1})"
                    if pool
                    else f"{where} asks for {kind} devices, but the cluster has none"
                )
            assigned[name] = (kind, [i for i in indices for _ in range(per_device)], str(value))

    load = Counter((kind, i) for kind, indices, _ in assigned.values() for i in indices)
    components = {}
    for name, (kind, indices, _) in assigned.items():
        pool = devices[kind]
        ranks = tuple(
            RankPlacement(rank=r, device=pool[i], share=1.0 / load[(kind, i)]) for r, i in enumerate(indices)
        )
        components[name] = ComponentPlacement(name=name, ranks=ranks)
    return Placement(components=components)


def share_devices(spec: Mapping[str, str], a: str, b: str) -> bool:
    """Whether components `a` and `b` of a component_placement overlap on any device, read from the spec
    alone (before a cluster exists): what decides collocated (they take turns) vs disaggregated."""
    placed: dict[str, set[tuple[str | None, int | str]]] = {}
    for key, value in spec.items():
        for name in component_names(key):
            if name in (a, b):
                kind, body = split_device_kind(value, name)
                body, _ = split_ranks_per_device(body, name)
                if body.strip() == "all":
                    placed[name] = {(kind, "all")}
                else:
                    placed[name] = {(kind, i) for i in parse_device_range(body, 0, name)}
    first, second = placed.get(a, set()), placed.get(b, set())
    kinds = {k for k, _ in first} & {k for k, _ in second}
    return bool(first & second) or any((k, "all") in first | second for k in kinds)


def _ranges(indices: list[int]) -> str:
    """Sorted device numbers as ranges: [2, 3, 4, 7] -> "2-4, 7"."""
    out, start = [], None
    for i, value in enumerate(indices):
        if start is None:
            start = value
        if i + 1 == len(indices) or indices[i + 1] != value + 1:
            out.append(f"{start}" if start == value else f"{start}-{value}")
            start = None
    return ", ".join(out)
