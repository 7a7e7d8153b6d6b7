"""What a SLURM allocation says about this node, for `ray_launch.sh start slurm`.

    python -m rlinf_like.runtime.slurm env     # prints shell assignments: HEAD_HOST, NODE_ID, ...

The node list is expanded with `scontrol show hostnames` when SLURM's tools are on PATH, else by
`expand_hostlist` (the bracket syntax: "gpu[01-03,07],login1"), so the logic is testable off-cluster.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p for p in parts if p]


def expand_hostlist(text: str) -> list[str]:
    """'node[01-03,7],gpu5' -> ['node01', 'node02', 'node03', 'node7', 'gpu5'] (zero padding kept)."""
    hosts: list[str] = []
    for part in _split_top_level(text.strip()):
        match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)", part)
        if match is None:
            if "[" in part or "]" in part:
                raise ValueError(f"cannot parse SLURM host list entry {part!r} in {text!r}")
            hosts.append(part)
            continue
        prefix, ranges, suffix = match.groups()
        for item in ranges.split(","):
            lo, _, hi = item.partition("-")
            if not lo.isdigit() or (hi and not hi.isdigit()):
                raise ValueError(f"cannot parse range {item!r} in SLURM host list {text!r}")
            width = len(lo)
            for n in range(int(lo), int(hi or lo) + 1):
                hosts.append(f"{prefix}{n:0{width}d}{suffix}")
    return hosts


@dataclass(frozen=True)
class SlurmNode:
    hosts: list[str]  # the allocation's nodes, in SLURM's order; the first one runs the Ray head
    node_id: int  # this node's index in `hosts`
    num_cpus: int | None  # what SLURM gives this node, never a hard-coded size
    num_gpus: int | None

    @property
    def head_host(self) -> str:
        return self.hosts[0]

    @property
    def is_head(self) -> bool:
        return self.node_id == 0


def _hostnames(nodelist: str) -> list[str]:
    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
        return out.stdout.split()
    return expand_hostlist(nodelist)


def _count(value: str | None) -> int | None:
    """SLURM_CPUS_ON_NODE is a number; SLURM_GPUS_ON_NODE may be 'a100:4' or absent."""
    if not value:
        return None
    return int(value.rsplit(":", 1)[-1])


def read_slurm_env(env: Mapping[str, str] = os.environ) -> SlurmNode:
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist or "SLURM_NODEID" not in env:
        raise RuntimeError("not inside a SLURM allocation: SLURM_JOB_NODELIST and SLURM_NODEID are unset "
                           "(run this under srun, one task per node)")
    hosts = _hostnames(nodelist)
    node_id = int(env["SLURM_NODEID"])
    expected = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or len(hosts))
    if expected != len(hosts) or not 0 <= node_id < len(hosts):
        raise RuntimeError(f"inconsistent SLURM environment: node list {nodelist!r} has {len(hosts)} host(s), "
                           f"SLURM_JOB_NUM_NODES={expected}, SLURM_NODEID={node_id}")
    return SlurmNode(hosts, node_id, _count(env.get("SLURM_CPUS_ON_NODE")), _count(env.get("SLURM_GPUS_ON_NODE")))


def main(argv: list[str]) -> int:
    if argv != ["env"]:
        print("usage: python -m rlinf_like.runtime.slurm env", file=sys.stderr)
        return 2
    try:
        node = read_slurm_env()
    except (RuntimeError, ValueError) as e:
        print(f"ray_launch.sh: {e}", file=sys.stderr)
        return 1
    values = {"HEAD_HOST": node.head_host, "NODE_ID": node.node_id, "NUM_NODES": len(node.hosts),
              "NODE_CPUS": node.num_cpus or "", "NODE_GPUS": node.num_gpus if node.num_gpus is not None else ""}
    for key, value in values.items():
        print(f"{key}={shlex.quote(str(value))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
