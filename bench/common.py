"""What every benchmark prints the same way: the machine it ran on, its load average, and the last JSON line.

    from bench.common import Machine, result_line
    machine = Machine.start()          # prints cores, CPU, torch, load average at start
    ...                                # each repetition printed by the bench
    machine.end()                      # prints the load average at the end
    print(result_line("name", ratio=ours / theirs, ...))   # ratios from medians, rounded

Kept free of torch at import time (run_all.py describes the machine without loading it).
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata

from rlinf_like.utils.hardware import cpu_model, isa_flags  # noqa: F401  (benches print them)


def usable_cores() -> int:
    """Cores this process may run on (affinity), which is what a bench gets; os.cpu_count() counts the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def load_average() -> tuple[float, float, float]:
    return tuple(round(x, 2) for x in os.getloadavg())  # type: ignore[return-value]


def version_of(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def missing_package(names: tuple[str, ...]) -> str | None:
    """The first of these import names that is not installed (a bench's optional packages), or None."""
    for name in names:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ModuleNotFoundError:  # a dotted name whose parent is missing
            return name
    return None


def describe_machine() -> dict:
    return {"cores": usable_cores(), "cpu": cpu_model(), "isa": isa_flags(), "torch": version_of("torch"),
            "python": platform.python_version(), "date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M")}


@dataclass(kw_only=True)
class Machine:
    """The machine and its load average at the start and end of a run (other jobs inflate absolute times)."""

    info: dict = field(default_factory=describe_machine)
    load_start: tuple[float, float, float] = field(default_factory=load_average)
    load_end: tuple[float, float, float] | None = None

    @classmethod
    def start(cls, settings: dict | None = None) -> Machine:
        machine = cls()
        if settings is not None:
            print("settings:", json.dumps(settings, default=str), flush=True)
        info = machine.info
        print(f"machine: {info['cores']} cores ({info['cpu']}; {info['isa']}), torch {info['torch']}, "
              f"python {info['python']}, "
              f"{info['date']}; load average at start {format_load(machine.load_start)}", flush=True)
        return machine

    def end(self) -> tuple[float, float, float]:
        self.load_end = load_average()
        print(f"load average at end {format_load(self.load_end)}", flush=True)
        return self.load_end


def format_load(load: tuple[float, ...] | list[float] | None) -> str:
    return "n/a" if not load else " / ".join(f"{x:.2f}" for x in load)


def median_ratio(numerators: list[float], denominators: list[float]) -> float:
    """median(numerators) / median(denominators): a ratio of medians, not a median of per-rep ratios."""
    return statistics.median(numerators) / statistics.median(denominators)


def result_line(bench: str, digits: int = 3, **fields) -> str:
    """The bench's last line: one JSON object; floats rounded to `digits`."""
    def rounded(v):
        if isinstance(v, float):
            return round(v, digits)
        if isinstance(v, dict):
            return {k: rounded(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [rounded(x) for x in v]
        return v
    return json.dumps({"bench": bench, **{k: rounded(v) for k, v in fields.items()}})


def assert_cold(engine) -> None:
    """Raise if `engine`'s prefix cache holds any block. A timed call must prefill every prompt, as a baseline
    without a prefix cache does; a cache kept from an earlier call (the warm-up, the last repetition) would time
    a lookup instead. Engines without a prefix cache pass."""
    pool = getattr(engine, "_pool", None)  # the native engine's block pool; None before its first call
    cached = pool.cached if pool is not None else 0
    if cached:
        raise AssertionError(f"prefix cache warm before a timed call: {cached} blocks cached "
                             "(reset_prefix_cache() first)")


@contextmanager
def cold_prefix_cache(engine) -> Iterator[None]:
    """Around one timed call of a native engine: its prefix cache emptied and checked empty before, and after
    it, no prompt token found in the cache and no sequence preempted (a re-admitted one finds its own blocks)
    during the call. Time inside the block; the reset and the checks stay outside the timing."""
    engine.reset_prefix_cache()
    assert_cold(engine)
    hits, preempted = engine.prefix_hit_tokens, engine.preemptions
    yield
    if engine.preemptions != preempted:
        raise AssertionError(f"{engine.preemptions - preempted} preemptions in a timed call: the KV cache budget "
                             "is short for the batch (raise it), so the timing is not of the decode asked for")
    if engine.prefix_hit_tokens != hits:
        raise AssertionError(f"{engine.prefix_hit_tokens - hits} prompt tokens came from the prefix cache "
                             "in a timed call (prompts repeated within it?)")


def alternating(measures: dict[str, Callable[[int], float]], reps: int,
                show: Callable[[int, dict[str, float]], None] | None = None) -> dict[str, list[float]]:
    """`measures[name](rep)` for each rep and name, the order reversed every other rep (a, b, b, a, ...), so a
    drift in the machine's load hits every side alike. Returns each side's values in rep order."""
    values: dict[str, list[float]] = {name: [] for name in measures}
    for rep in range(reps):
        for name in (list(measures) if rep % 2 == 0 else list(measures)[::-1]):
            values[name].append(measures[name](rep))
        if show is not None:
            show(rep, {name: v[-1] for name, v in values.items()})
    return values


def step_seconds(full_s: float, one_s: float, new_tokens: int) -> float:
    """A decode step's time: a call making `new_tokens` tokens per sequence less one making 1 (the same prompts,
    so the same prefill), over the steps between them."""
    return (full_s - one_s) / (new_tokens - 1)


def seed_for(batch: int, rep: int) -> int:
    """The prompts' seed of one timed call, so that every call gets prompts of its own: by the measurement (0: the
    throughput call, else the decode-step batch size) and the repetition (-1: the untimed warm-up)."""
    return 100_000 * batch + rep + 1


def parse_batches(text: str) -> list[int]:
    """`--step-batches 1,32,128`: the batch sizes; empty or "none": none."""
    text = text.strip()
    return [] if text in ("", "none") else [int(b) for b in text.split(",")]


def random_weights_model(config_json: str, **from_config):
    """A transformers causal LM of `config_json`'s shape (a model's config.json) with seeded random weights
    (transformers' own init): a size to time without its checkpoint (the GPU machine reaches no hub).
    `from_config` goes to `AutoModelForCausalLM.from_config` (dtype, attn_implementation)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with open(config_json) as f:
        raw = json.load(f)
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, **from_config)
