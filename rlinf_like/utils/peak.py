"""The measured matrix-product peak of this host: the denominator of every MFU figure.

A vendor's peak says little on a shared 2-core VM, so the limit is measured: the best rate of a few matmuls at a
decoder's training shapes, on one thread per worker rank (how ranks run, `utils/threads.py`) in the precision the
run computes in. The probe takes ~1 s, once per machine: the result is cached by CPU model, ISA flags, threads,
precision and torch version (or by GPU model) in `$RLINF_CACHE_DIR` (default `~/.cache/rlinf_like`).

A reading taken while other processes had the core (the probe's thread ran less than `QUIET_SHARE` of the wall
time: a test suite, another run starting) understates the limit, and MFU read against it comes out high. Such a
reading is used, marked, and probed again by the first run after `REPROBE_S`; the cache keeps the best reading, and
once one was quiet it is final.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from rlinf_like.utils.hardware import cpu_model, isa_flags

log = logging.getLogger(__name__)
# (tokens, in, out): a decoder's projections and MLP at SmolLM2-135M's widths, and a square one
CPU_SHAPES = ((2048, 576, 1536), (2048, 1536, 576), (1024, 1024, 1024))
GPU_SHAPES = ((8192, 4096, 4096), (8192, 4096, 11008))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


QUIET_SHARE = 0.9  # the probe thread's CPU time over its wall time, at or above which a reading counts as quiet
REPROBE_S = 600.0  # a reading taken under load is probed again by the first run this long after it


@dataclass(frozen=True)
class Peak:
    flops_per_s: float  # per worker rank: one CPU thread, or one GPU
    precision: str
    where: str  # the CPU model and flags with the thread count, or the GPU model
    cached: bool = False
    quiet: bool = True  # False: every reading so far was taken while the core was shared, so the peak is low

    def describe(self) -> str:
        load = "" if self.quiet else "; taken while the core was shared, so MFU reads high: probed again later"
        return (f"matmul peak {self.flops_per_s / 1e9:,.1f} GFLOP/s a rank ({self.precision}, {self.where}; "
                f"{'cached' if self.cached else 'measured now'}{load})")


def cache_dir() -> Path:
    return Path(os.environ.get("RLINF_CACHE_DIR") or Path.home() / ".cache" / "rlinf_like")


def _rate(shape: tuple[int, int, int], dtype: torch.dtype, device: str, seconds: float) -> tuple[float, float]:
    """The best FLOP/s of repeated products at `shape`, and the share of the wall time this thread had a core."""
    m, k, n = shape
    g = torch.Generator().manual_seed(0)  # never the global generator: in process, the run's workers share it
    a, b = (torch.randn(*s, generator=g).to(device=device, dtype=dtype) for s in ((m, k), (k, n)))
    start, cpu = time.perf_counter(), time.thread_time()
    torch.mm(a, b)  # the first call picks and loads kernels
    first = time.perf_counter() - start
    if first > seconds:  # a precision without a hardware path (bf16 on AVX2: ~10 s a call): this call is the rate
        return 2.0 * m * k * n / first, (time.thread_time() - cpu) / first
    best, end = 0.0, time.perf_counter() + seconds
    began, cpu = time.perf_counter(), time.thread_time()
    while time.perf_counter() < end:
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        if device != "cpu":
            torch.cuda.synchronize()
        best = max(best, 4 * 2.0 * m * k * n / (time.perf_counter() - start))
    return best, (time.thread_time() - cpu) / (time.perf_counter() - began)


def measure(precision: str, device: str = "cpu", threads: int = 1, seconds: float = 0.3) -> tuple[float, bool]:
    """The best FLOP/s of the probe's shapes (`seconds` each), on `threads` threads for a CPU, and whether the
    probe had its core throughout (a GPU's reading is its own)."""
    dtype = DTYPES[precision]
    if device != "cpu":
        return max(_rate(s, dtype, device, seconds)[0] for s in GPU_SHAPES), True
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rates = [_rate(s, dtype, device, seconds) for s in CPU_SHAPES]
    finally:
        torch.set_num_threads(before)
    return max(r for r, _ in rates), min(share for _, share in rates) >= QUIET_SHARE


def matmul_peak(precision: str, device: str = "cpu", threads: int = 1) -> Peak:
    """This host's peak for one worker rank, from the cache or measured (and cached, with whether it was quiet)."""
    if device == "cpu":
        where = f"{cpu_model()} [{isa_flags()}], {threads} thread(s)"
    else:
        where = torch.cuda.get_device_name(device)
    key = f"{where} | {precision} | torch {torch.__version__}"
    path = cache_dir() / "matmul_peak.json"
    try:
        known = json.loads(path.read_text())
    except (OSError, ValueError):
        known = {}
    entry = known.get(key)
    if isinstance(entry, (int, float)):  # a cache written before readings were marked: probed again once
        entry = {"flops_per_s": float(entry), "quiet": False, "measured_at": 0.0}
    if entry and (entry["quiet"] or time.time() - entry["measured_at"] < REPROBE_S):
        return Peak(entry["flops_per_s"], precision, where, cached=True, quiet=entry["quiet"])
    flops, quiet = measure(precision, device, threads)
    if entry:  # the best reading is the nearest to the limit; one quiet reading settles it
        flops, quiet = max(flops, entry["flops_per_s"]), quiet or entry["quiet"]
    known[key] = {"flops_per_s": flops, "quiet": quiet, "measured_at": time.time()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(path)  # two runs probing at once each leave a whole file
    except OSError as err:
        log.warning("could not cache the matmul peak in %s: %s", path, err)
    return Peak(flops, precision, where, quiet=quiet)
