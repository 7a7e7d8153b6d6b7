"""Helpers both runners use: the actor -> rollout weight sync's connection, checkpoint directories with an
atomic runner-state file, the workers' pid file, a crash hook for fault tests, and the closing plot."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

from rlinf_like.hybrid_engines.reshard import SyncPlan
from rlinf_like.runtime import WorkerGroup, connect_groups, wait_all

CRASH_ENV = "RLINF_LIKE_CRASH_AT"


def connect_weight_sync(actor: WorkerGroup, rollout: WorkerGroup, name: str, backend: str | None = None,
                        transport: str = "group") -> SyncPlan:
    """The actor -> rollout weight sync over peer group `name`: its plan from both sides' layouts, each side's
    endpoint connected. Under LoRA the first round sends the base weights and the adapters, later rounds the
    adapters only, and the rollout merges them (`hybrid_engines/lora_sync.py`)."""
    connect_groups(actor, rollout, name, backend=backend)
    [adapters] = actor.on_ranks(0).adapter_spec().wait()
    [src] = actor.on_ranks(0).weight_layouts().wait()
    [dst] = rollout.on_ranks(0).weight_layouts(adapters).wait()
    [changing] = actor.on_ranks(0).changing_tensors().wait()
    plan = SyncPlan.build(src, dst, actor.name, rollout.name, changing=changing)
    wait_all([actor.connect_weights(name, plan, transport), rollout.connect_weights(name, plan, transport, adapters)])
    return plan


def connect_env_wire(env: WorkerGroup, rollout: WorkerGroup) -> None:
    """The env <-> rollout wire of the embodied runners: env rank e talks to rollout rank e % rollout ranks."""
    connect_groups(env, rollout, "env_wire")
    n_env, n_roll = env.world_size, rollout.world_size
    wait_all([env.on_ranks(e).connect_rollout("env_wire", n_env + e % n_roll) for e in range(n_env)] +
             [rollout.on_ranks(r).connect_envs("env_wire", list(range(r, n_env, n_roll))) for r in range(n_roll)])


def write_json_atomic(path: Path, state: dict) -> None:
    """Write then rename: a crash leaves the previous file whole (the runner state flips only
    after the worker state it points to is complete)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


class Checkpoints:
    """`root/step_<n>/` holds the workers' state after step n; `root/runner.json` (the runner state,
    written atomically and last) names the one complete directory. A crash at any point of a save
    leaves runner.json naming the previous complete step; the next commit removes the partial one.
    (Saving over one fixed directory would not do: the actor's state could flip to step n while
    runner.json still says step n - k.)"""

    def __init__(self, root: Path):
        self.root = root
        self.state_file = root / "runner.json"

    def exists(self) -> bool:
        return self.state_file.exists()

    def step_dir(self, step: int) -> Path:
        return self.root / f"step_{step}"

    def latest(self) -> tuple[Path, dict]:
        """The complete checkpoint's directory and runner state."""
        state = json.loads(self.state_file.read_text())
        if "checkpoint" not in state:
            raise ValueError(f"{self.state_file} names no step directory (a checkpoint from before step "
                             f"directories); start a new runner.output_dir")
        return self.root / state["checkpoint"], state

    def commit(self, step: int, state: dict) -> None:
        """Call after every worker finished writing `step_dir(step)`: flip runner.json to it, then
        drop every other step directory (older ones, and partial ones of a crashed save)."""
        current = self.step_dir(step)
        write_json_atomic(self.state_file, {**state, "checkpoint": current.name})
        for other in self.root.glob("step_*"):
            if other != current:
                shutil.rmtree(other, ignore_errors=True)


def write_worker_pids(out: Path, groups: dict) -> None:
    """`out/workers.json`: each worker group's process ids by rank, for an operator (or a fault test)
    who needs to find, inspect or kill a worker from outside."""
    write_json_atomic(out / "workers.json", {name: g.pids for name, g in groups.items() if g is not None})


def crash_point(where: str, step: int) -> None:
    """Test hook: with RLINF_LIKE_CRASH_AT="<where>:<step>" this process SIGKILLs itself here (no
    cleanup, like a lost node), so a test can interrupt a run at an exact point. Unset: a no-op."""
    if os.environ.get(CRASH_ENV) == f"{where}:{step}":
        os.kill(os.getpid(), signal.SIGKILL)


def plot_series(path: Path, series: list[tuple[str, list[tuple[float, float]], dict]], xlabel: str,
                ylim: tuple[float, float] | None = None, title: str = "") -> None:
    """One PNG with a line per (label, points, matplotlib kwargs); empty series are skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, points, style in series:
        if points:
            ax.plot(*zip(*points), label=label, **style)
    ax.set_xlabel(xlabel)
    if ylim:
        ax.set_ylim(*ylim)
    if title:
        ax.set_title(title)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
