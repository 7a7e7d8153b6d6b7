"""Hand the memory a CPU training step freed back to the OS.

glibc's malloc keeps freed heap memory for reuse, and after a large block allocated by mmap is freed it raises its
mmap threshold (up to 32 MiB), so that later tensors of that size come from the heap too. A training step allocates
activations of a different shape every step (the answers' lengths change), so the heap fragments and a rank's
resident memory climbs step after step: on SmolLM2 with 256-token answers an FSDP rank went 4.0 -> 6.3 GB in three
steps, and `malloc_trim(0)` took it back to 3.2 GB (docs/benchmarks/reasoning.md, IFEval). Ray's memory monitor reads resident memory,
so the held pages kill runs that fit."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# Below this much free heap a trim is not worth it: the next step faults the returned pages in again (a tiny model's
# in-process golden run took ~10% longer when every step trimmed).
TRIM_ABOVE = 256 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@functools.cache
def _glibc():
    """(malloc_trim, mallinfo2) of glibc >= 2.33, or None (another C library, another OS)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "malloc_trim") or not hasattr(libc, "mallinfo2"):
        return None
    libc.mallinfo2.restype = _MallInfo2
    return libc.malloc_trim, libc.mallinfo2


def return_freed_memory(above: int = TRIM_ABOVE) -> bool:
    """Release the heaps' free pages to the OS when more than `above` bytes are free; whether it did."""
    calls = _glibc()
    if calls is None or calls[1]().fordblks <= above:
        return False
    calls[0](0)
    return True
