"""Hand the memory a CPU training step freed back to the OS.

glibc's malloc keeps freed heap memory for reuse, and after a large block allocated by mmap is freed it raises its
mmap threshold (up to 32 MiB), so that later tensors of that size come from the heap too. A training step allocates
activations of a different shape every step (the answers' lengths change), so the heap fragments and a rank's
resident memory climbs step after step: on SmolLM2 with 256-token answers an FSDP rank went 4.0 -> 6.3 GB in three
steps, and `malloc_trim(0)` took it back to 3.2 GB (docs/benchmarks.md). Ray's memory monitor reads resident memory,
so the held pages kill runs that fit."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _trim():
    """glibc's `malloc_trim`, or None (another C library, another OS)."""
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    except OSError:
        return None


def return_freed_memory() -> bool:
    """Release the heap's free pages to the OS; whether this C library can."""
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True
