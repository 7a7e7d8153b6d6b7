"""The measured matrix-product peak of this host: the denominator of every MFU figure.

A vendor's peak says little on a shared 2-core VM, so the limit is measured: the best rate of a few matmuls at a
decoder's training shapes, on one thread per worker rank (how ranks run, `utils/threads.py`) in the precision the
run computes in. The probe takes ~1 s, once per machine: the result is cached by CPU model, ISA flags, threads,
precision and torch version (or by GPU model) in `$RLINF_CACHE_DIR` (default `~/.cache/rlinf_like`).
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


@dataclass(frozen=True)
class Peak:
    flops_per_s: float  # per worker rank: one CPU thread, or one GPU
    precision: str
    where: str  # the CPU model and flags with the thread count, or the GPU model
    cached: bool = False

    def describe(self) -> str:
        return (f"matmul peak {self.flops_per_s / 1e9:,.1f} GFLOP/s a rank ({self.precision}, {self.where}; "
                f"{'cached' if self.cached else 'measured now'})")


def cache_dir() -> Path:
    return Path(os.environ.get("RLINF_CACHE_DIR") or Path.home() / ".cache" / "rlinf_like")


def _rate(shape: tuple[int, int, int], dtype: torch.dtype, device: str, seconds: float) -> float:
    m, k, n = shape
    g = torch.Generator().manual_seed(0)  # never the global generator: in process, the run's workers share it
    a, b = (torch.randn(*s, generator=g).to(device=device, dtype=dtype) for s in ((m, k), (k, n)))
    start = time.perf_counter()
    torch.mm(a, b)  # the first call picks and loads kernels
    first = time.perf_counter() - start
    if first > seconds:  # a precision without a hardware path (bf16 on AVX2: ~10 s a call): this call is the rate
        return 2.0 * m * k * n / first
    best, end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        if device != "cpu":
            torch.cuda.synchronize()
        best = max(best, 4 * 2.0 * m * k * n / (time.perf_counter() - start))
    return best


def measure(precision: str, device: str = "cpu", threads: int = 1, seconds: float = 0.3) -> float:
    """The best FLOP/s of the probe's shapes (`seconds` each), on `threads` threads for a CPU."""
    dtype = DTYPES[precision]
    if device != "cpu":
        return max(_rate(s, dtype, device, seconds) for s in GPU_SHAPES)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return max(_rate(s, dtype, device, seconds) for s in CPU_SHAPES)
    finally:
        torch.set_num_threads(before)


def matmul_peak(precision: str, device: str = "cpu", threads: int = 1) -> Peak:
    """This host's peak for one worker rank, from the cache or measured (and cached)."""
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
    if key in known:
        return Peak(known[key], precision, where, cached=True)
    peak = Peak(measure(precision, device, threads), precision, where)
    known[key] = peak.flops_per_s
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known, indent=1))
        tmp.replace(path)  # two runs probing at once each leave a whole file
    except OSError as err:
        log.warning("could not cache the matmul peak in %s: %s", path, err)
    return peak
