"""Plots for the benchmark pages, drawn from the pages' own tables (the tables stay the one source of the figures):
the main job's held-out accuracy by GRPO step (docs/benchmarks/reasoning.md) and the rollout's decode step against
batch size (docs/benchmarks/rollout.md). Rerun after editing either table.

    python bench/plot_pages.py
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PAGES = Path(__file__).resolve().parents[1] / "docs" / "benchmarks"


def table(page: Path, header_start: str) -> list[list[str]]:
    """The rows (cells stripped, header first) of the markdown table whose header row starts with `header_start`."""
    lines = page.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header_start}"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        if not re.fullmatch(r"\|[-| ]+\|", line):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def _number(cell: str) -> float | None:
    found = re.match(r"\**([0-9.]+)", cell)
    return float(found.group(1)) if found else None


def main_job_curve(out: Path) -> Path:
    header, *rows = table(PAGES / "reasoning.md", "host, date | precision, layout")
    steps = [0] + [int(h) for h in header[4:10]]  # "after SFT" is step 0
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for row in rows:
        values = [_number(c) for c in row[3:10]]
        if all(v is not None for v in values):  # the rows with every evaluation
            ax.plot(steps, values, marker="o", label=f"{row[0]}, {row[1]}".replace("`", ""))
    ax.set(xlabel="GRPO step", ylabel="held-out greedy accuracy", title="The main job (grpo_collocated)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return _save(fig, out / "main_job_accuracy.png")


def decode_step_curve(out: Path) -> Path:
    _, *rows = table(PAGES / "rollout.md", "batch | native | transformers")
    batch = [int(r[0]) for r in rows]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    ax.plot(batch, [_number(r[1]) for r in rows], marker="o", label="native engine")
    ax.plot(batch, [_number(r[2]) for r in rows], marker="o", label="transformers (its faster mode)")
    ax.set(xscale="log", xlabel="batch (sequences decoding)", ylabel="decode step (ms)",
           title="SmolLM2-135M decode step against batch")
    ax.set_xticks(batch, [str(b) for b in batch])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out / "decode_step_by_batch.png")


def _save(fig, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    # no timestamp in the file: the same table draws the same bytes
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=PAGES / "img", help="where the PNGs go")
    args = parser.parse_args(argv)
    for path in (main_job_curve(args.out), decode_step_curve(args.out)):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
