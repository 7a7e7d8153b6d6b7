"""The generated table of docs/benchmarks/index.md: render it, read it back, and merge a partial run into it.

Each bench's rows carry their own provenance in the last column (full or **quick**, when the bench started, its
wall time, the 1-minute load average at its start and end, flags beyond its defaults), so a table assembled from
separate runs (`run_all.py --merge --only ...`) says which number came from which run. `parse` reads back what
`render` writes (exactly: `render(parse(block)) == block`), and also the older single-run table (one header line
for the whole run, no run column), whose rows it tags with that run's date, mode and whole-run load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

BEGIN, END = "<!-- run_all:begin -->", "<!-- run_all:end -->"
TITLE = "## Summary: the latest `bench/run_all.py` runs (generated; edit `bench/run_all.py`, not this table)"
LEGEND = ("Each bench ran alone, in its own process. The run column gives each bench's mode (**quick**: smoke "
          "sizes, its ratios are *not* measurements; full: the bench's own settings, or the flags shown), when it "
          "started, its wall time and the 1-minute load average at its start → end; rows from separate runs are "
          "merged by `bench/run_all.py --merge`.")
HEAD = ["| bench | ratio | value | target | | run |", "|---|---|---|---|---|---|"]
OLD_HEAD = ["| bench | ratio | value | target | |", "|---|---|---|---|---|"]


@dataclass(kw_only=True)
class Table:
    machine: str  # one line: cores, CPU, torch, python (of the latest run)
    rows: dict[str, list[str]] = field(default_factory=dict)  # bench -> its rows as written, in table order


def provenance(*, quick: bool, started: str, seconds: float, load: tuple[float, float] | None,
               flags: tuple[str, ...] = (), whole_run: bool = False) -> str:
    """The run cell; `whole_run`: the load is the whole multi-bench run's (older tables), not this bench's."""
    mode = "**quick**" if quick else "full"
    loads = "load n/a" if load is None else f"{'whole-run ' * whole_run}load {load[0]:.2f} → {load[1]:.2f}"
    extra = f", `{' '.join(flags)}`" if flags else ""
    return f"{mode} {started}, {seconds:.0f} s, {loads}{extra}".replace("|", "/")


def row_line(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def render(table: Table) -> str:
    rows = [line for lines in table.rows.values() for line in lines]
    return "\n".join([BEGIN, "", TITLE, "", table.machine, "", LEGEND, "", *HEAD, *rows, "", END])


def merge(old: Table, new: Table, order: list[str]) -> Table:
    """`old` with the benches in `new` replaced (or added); benches in `order` first, in that order, then any others
    `old` had. The machine line is the newer run's."""
    names = [b for b in order if b in old.rows or b in new.rows]
    names += [b for b in old.rows if b not in names] + [b for b in new.rows if b not in names]
    return Table(machine=new.machine, rows={b: new.rows.get(b) or old.rows[b] for b in names})


def block_of(doc: str) -> str | None:
    if BEGIN not in doc or END not in doc:
        return None
    return BEGIN + doc.split(BEGIN, 1)[1].split(END, 1)[0] + END


def _group(lines: list[str]) -> dict[str, list[str]]:
    rows: dict[str, list[str]] = {}
    for line in lines:
        rows.setdefault(line.split("|")[1].strip(), []).append(line)
    return rows


def parse(block: str) -> Table:
    """The table in a generated block (this format or the older single-run one); ValueError if it is neither."""
    lines = block.split("\n")
    table_rows = [line for line in lines if line.startswith("| ") and line not in HEAD + OLD_HEAD]
    if HEAD[0] in lines:
        machine = lines[lines.index(TITLE) + 2] if TITLE in lines else ""
        return Table(machine=machine, rows=_group(table_rows))
    if OLD_HEAD[0] in lines:
        return _parse_old(lines, table_rows)
    raise ValueError("no run_all table in this block")


def _parse_old(lines: list[str], table_rows: list[str]) -> Table:
    """The single-run format: a header line with date, mode and whole-run loads; a 'Wall time' line per bench."""
    header = next(line for line in lines if " cores (" in line)
    date = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d)", header)
    loads = re.findall(r"load average ([\d.]+) / [\d.]+ / [\d.]+ at start, ([\d.]+) / [\d.]+ / [\d.]+ at end", header)
    wall = next((line for line in lines if line.startswith("Wall time")), "")
    seconds = {name: float(s) for name, s in re.findall(r"(\w+) (\d+) s", wall.split(":", 1)[-1])}
    cores = re.search(r"(\d+ cores \(.*?python [\d.]+)", header)
    machine = f"Machine: {cores.group(1)}." if cores else ""
    rows: dict[str, list[str]] = {}
    for bench, group in _group(table_rows).items():
        run = provenance(quick="`--quick`" in header, started=date.group(1) if date else "?",
                         seconds=seconds.get(bench, 0.0), whole_run=True,
                         load=(float(loads[0][0]), float(loads[0][1])) if loads else None)
        rows[bench] = [line + f" {run} |" for line in group]
    return Table(machine=machine, rows=rows)
