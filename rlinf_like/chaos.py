"""A chaos harness: SIGKILL a run's worker processes at random times, from a seed, and report how the run ended.

    python -m rlinf_like.chaos --kills 2 --seed 0 -- python examples/reasoning/main_grpo.py \\
        runner.max_restarts=2 runner.output_dir=runs/chaos

The run's own command follows `--`; its `runner.output_dir` (or `--out`) says where its `workers.json` lists the
live worker processes by component, which the run rewrites whenever it relaunches them. Each kill waits a delay
drawn from [--min-gap, --max-gap] seconds (the first one after `--wait-for`'s file appears), then picks a component and one of its ranks' processes from the seeded
generator. A run that survives its faults needs `runner.max_restarts` at least `--kills`
(`rlinf_like/runtime/recovery.py`). Exits with the run's return code; the last line is one JSON object: the kills
(component, rank, pid, seconds after the start) and the run's return code.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path


def live_workers(out: Path) -> dict[str, list[int]]:
    """The run's worker processes by component (`workers.json`), without ones already gone."""
    try:
        groups = json.loads((out / "workers.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or being replaced
        return {}
    return {name: pids for name, pids in groups.items() if pids and all(Path(f"/proc/{p}").exists() for p in pids)}


def pick_from(out: Path, wanted: set[str]) -> dict[str, list[int]]:
    """The live workers of the components asked for (all when `wanted` is empty)."""
    return {c: pids for c, pids in live_workers(out).items() if not wanted or c in wanted}


def output_dir(command: list[str]) -> Path | None:
    found = [word.split("=", 1)[1] for word in command if word.startswith("runner.output_dir=")]
    return Path(found[-1]) if found else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        raise SystemExit("usage: python -m rlinf_like.chaos [options] -- <run command>")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m rlinf_like.chaos", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=1, help="how many worker processes to SIGKILL")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-gap", type=float, default=5.0, help="seconds at least between the workers' start "
                                                                    "or the previous kill and the next kill")
    parser.add_argument("--max-gap", type=float, default=20.0)
    parser.add_argument("--components", default="", help="comma-separated components to pick from (default: all)")
    parser.add_argument("--out", default="", help="the run's output_dir, if its command does not set it")
    parser.add_argument("--wait-for", default="", help="a file under the output_dir (e.g. checkpoint/runner.json: "
                                                       "the first committed checkpoint) to wait for before the kills")
    args, command = parser.parse_args(argv[:split]), argv[split + 1:]
    out = Path(args.out) if args.out else output_dir(command)
    if not command or out is None:
        raise SystemExit("chaos: give the run command after `--`, with runner.output_dir=... (or --out)")
    if not 0 <= args.min_gap <= args.max_gap:
        raise SystemExit(f"chaos: --min-gap {args.min_gap} and --max-gap {args.max_gap}: need 0 <= min <= max")
    wanted = {c for c in args.components.split(",") if c}
    rng = random.Random(args.seed)
    (out / "workers.json").unlink(missing_ok=True)  # an earlier run's pids are not this run's
    start = time.monotonic()
    run = subprocess.Popen(command)
    kills: list[dict] = []
    try:
        while args.wait_for and run.poll() is None and not (out / args.wait_for).exists():
            time.sleep(0.2)
        while len(kills) < args.kills and run.poll() is None:
            time.sleep(rng.uniform(args.min_gap, args.max_gap))
            workers = pick_from(out, wanted)
            while run.poll() is None and not workers:  # between a fault and the relaunch nothing is listed alive
                time.sleep(0.2)
                workers = pick_from(out, wanted)
            if run.poll() is not None:
                break
            if run.pid in {p for pids in workers.values() for p in pids}:
                run.kill()
                raise SystemExit("chaos: the workers run inside the driver (cluster.backend=local): nothing to kill "
                                 "but the run itself; use the Ray backend")
            component = rng.choice(sorted(workers))
            rank = rng.randrange(len(workers[component]))
            pid = workers[component][rank]
            os.kill(pid, signal.SIGKILL)
            kill = {"component": component, "rank": rank, "pid": pid, "at_s": round(time.monotonic() - start, 1)}
            kills.append(kill)
            print(f"chaos: killed {component}[rank {rank}] (pid {pid}) at {kill['at_s']} s", flush=True)
        rc = run.wait()
    except BaseException:
        run.kill()
        raise
    print(json.dumps({"chaos": kills, "seed": args.seed, "returncode": rc}))
    return rc


if __name__ == "__main__":
    sys.exit(main())
