"""Helpers both runners use: the atomic runner-state file of a checkpoint and the closing plot."""

from __future__ import annotations

import json
from pathlib import Path


def write_json_atomic(path: Path, state: dict) -> None:
    """Write then rename: a crash leaves the previous file whole (the runner state flips only
    after the worker state it points to is complete)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


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
