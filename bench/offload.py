"""Offload / onload bandwidth of a model's params + grads + Adam state versus a plain copy.

The baseline is one `dst.copy_(src)` of the same number of bytes between two preallocated
buffers on this machine, the ceiling for moving them. Onload is also compared with allocating
the device buffer and then copying: on CPU, freed memory goes back to the OS and comes back as
fresh pages that fault on first touch (the CUDA caching allocator has no such cost; our residency manager keeps
the freed CPU blocks for the next onload the same way). Host buffers are warm on both sides (our residency manager
allocates them once and reuses them). Repetitions alternate; medians.
Last line: one JSON object, ratios are ours / copy (higher is better).

    python bench/offload.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
from torch import nn

from rlinf_like.hybrid_engines import ResidencyManager


def build(hidden: int, layers: int, device: str):
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(hidden, hidden) for _ in range(layers)]).to(device)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, hidden, device=device)).sum().backward()
    opt.step()  # creates exp_avg / exp_avg_sq
    return model, opt


def timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    hidden, layers, reps = (1024, 8, 3) if args.quick else (2048, 12, 5)
    print(f"load average at start: {os.getloadavg()}")
    model, opt = build(hidden, layers, device)
    res = ResidencyManager(model, opt)
    res.offload()  # first round allocates the host buffers
    res.onload()
    total = sum(res.device_bytes(p) for p in ("params", "grads", "optimizer"))
    src = torch.empty(total, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty(total, dtype=torch.uint8, pin_memory=device == "cuda")
    dst.copy_(src)  # warm both buffers

    def alloc_and_copy():  # what onload must do at least: get the device memory back, then fill it
        torch.empty(total, dtype=torch.uint8, device=device).copy_(dst)

    ours_off, ours_on, copy_off, copy_on, alloc_on = [], [], [], [], []
    for _ in range(reps):
        copy_off.append(timed(lambda: dst.copy_(src)))
        ours_off.append(timed(lambda: res.offload()))
        copy_on.append(timed(lambda: src.copy_(dst)))
        alloc_on.append(timed(alloc_and_copy))
        ours_on.append(timed(lambda: res.onload()))
    gb = total / 1e9
    rows = {
        "offload": (gb / statistics.median(ours_off), gb / statistics.median(copy_off)),
        "onload": (gb / statistics.median(ours_on), gb / statistics.median(copy_on)),
    }
    print(f"{total / 2**20:.0f} MiB of params + grads + Adam state on {device}, {reps} reps, "
          f"{torch.get_num_threads()} thread(s), {os.cpu_count()} cores, keep_freed={res.keep_freed}")
    for i in range(reps):
        print(f"  rep {i}: offload {ours_off[i]:.4f} s (copy {copy_off[i]:.4f} s)   "
              f"onload {ours_on[i]:.4f} s (copy {copy_on[i]:.4f} s, allocate + copy {alloc_on[i]:.4f} s)")
    for name, (ours, base) in rows.items():
        print(f"{name:>8}: residency {ours:6.2f} GB/s   plain copy {base:6.2f} GB/s   ratio {ours / base:.3f}")
    alloc_gb_s = gb / statistics.median(alloc_on)
    print(f"  onload vs allocate + copy {alloc_gb_s:6.2f} GB/s   ratio {rows['onload'][0] / alloc_gb_s:.3f}")
    print(f"load average at end: {os.getloadavg()}")
    print(json.dumps({"bench": "offload", "offload_ratio": round(rows["offload"][0] / rows["offload"][1], 3),
                      "onload_ratio": round(rows["onload"][0] / rows["onload"][1], 3),
                      "onload_ratio_vs_alloc_copy": round(rows["onload"][0] / alloc_gb_s, 3),
                      "bytes": total, "device": device}))


if __name__ == "__main__":
    main()
