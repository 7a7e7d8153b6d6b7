"""utils/heap.py: the heap pages a step freed go back to the OS (glibc keeps them otherwise, and Ray's memory monitor
reads resident memory). In a fresh process, so pytest's own heap does not blur the figure."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
from rlinf_like.utils.heap import return_freed_memory

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

blocks = [bytearray(100_000) for _ in range(5000)]  # ~500 MB from the heap, each below glibc's mmap threshold
keep = blocks[-1]
del blocks  # all freed but the last: the heap's top stays in use, so glibc cannot shrink the heap by itself
before = rss()
print(return_freed_memory(above=1 << 40), return_freed_memory(), before, rss())
"""


def test_freed_heap_pages_go_back_to_the_os():
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    below, trimmed, before, after = done.stdout.split()
    assert below == "False"  # less free than the threshold: left alone (the next step would fault the pages back)
    assert trimmed == "True"  # glibc: this machine kind's C library
    assert int(before) > 450 * 2**20 and int(after) < int(before) - 400 * 2**20, (before, after)
