"""The output layer's cost in one training forward+backward: the full pass ([B, T, V] fp32 logits, log_softmax and
the entropy's exp) against the chunked head (hybrid_engines/head_stats.py), in fp32 and bf16, on CPU or CUDA.

    python bench/logprob_head.py --rows 16 --length 68 --layers 4 --reps 3

The model is shaped like SmolLM2-135M (hidden 576, intermediate 1536, 9/3 heads, vocabulary 49,152) with
`--layers` decoder layers and random weights, so it runs where the checkpoint is not (the GPU machine). A loss
reads the last 60% of each row, as a GRPO response does. Each repetition runs every side once, in alternating
order; memory is the peak above the step's start (CUDA: the allocator's peak; CPU: RSS sampled every 5 ms).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench.common import Machine, result_line  # noqa: E402
from rlinf_like.hybrid_engines.model_manager import token_stats  # noqa: E402

FULL = 1 << 62


def rss() -> int:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def peak_above_start(device: torch.device):
    out = {}
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        yield out
        torch.cuda.synchronize()
        out["peak"] = torch.cuda.max_memory_allocated() - start
        return
    start, peak, stop = rss(), [0], threading.Event()

    def poll():
        while not stop.is_set():
            peak[0] = max(peak[0], rss())
            time.sleep(0.005)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    yield out
    stop.set()
    thread.join()
    out["peak"] = max(0, max(peak[0], rss()) - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--length", type=int, default=68)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="8 rows, 2 layers, 1 repetition")
    args = p.parse_args()
    if args.quick:
        args.rows, args.layers, args.reps = 8, 2, 1
    from transformers import LlamaConfig, LlamaForCausalLM

    device = torch.device(args.device)
    machine = Machine.start()
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=args.layers,
                      num_attention_heads=9, num_key_value_heads=3, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).float().to(device).train()
    ids = torch.randint(0, cfg.vocab_size, (args.rows, args.length), device=device)
    response = torch.zeros(args.rows, args.length - 1, device=device)
    response[:, int(0.4 * args.length):] = 1
    batch = dict(input_ids=ids, attention_mask=torch.ones_like(ids), response_mask=response)
    print(f"settings: rows {args.rows} x length {args.length}, {args.layers} layers, vocab {cfg.vocab_size}, "
          f"device {device}{' ' + torch.cuda.get_device_name(device) if device.type == 'cuda' else ''}, "
          f"threads {torch.get_num_threads()}, reps {args.reps}")

    def step(chunk_bytes: int, precision: str) -> tuple[float, int]:
        model.zero_grad(set_to_none=True)
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
        with peak_above_start(device) as mem:
            start = time.perf_counter()
            with autocast:
                lp, ent = token_stats(model, batch, entropy_grad=False, chunk_bytes=chunk_bytes)
            (-(lp * response).sum() / response.sum()).backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - start
        return seconds, mem["peak"]

    sides = [(head, precision) for precision in ("fp32", "bf16") for head in ("full", "chunked")]
    for side in sides:  # warm-up: kernels chosen, allocator grown, outside the measured reps
        step(FULL if side[0] == "full" else 256 << 20, side[1])
    got: dict[tuple[str, str], list[tuple[float, int]]] = {s: [] for s in sides}
    for rep in range(args.reps):
        for side in (sides if rep % 2 == 0 else sides[::-1]):
            got[side].append(step(FULL if side[0] == "full" else 256 << 20, side[1]))
            s, m = got[side][-1]
            print(f"rep {rep} {side[0]:>7} {side[1]}: {s:.3f} s, peak +{m / 2**20:.0f} MiB", flush=True)
    machine.end()
    med = {s: (statistics.median(x[0] for x in v), statistics.median(x[1] for x in v)) for s, v in got.items()}
    ratios = {}
    for precision in ("fp32", "bf16"):
        full, chunk = med[("full", precision)], med[("chunked", precision)]
        ratios[f"{precision}_memory_chunked_over_full"] = chunk[1] / max(1, full[1])
        ratios[f"{precision}_time_chunked_over_full"] = chunk[0] / full[0]
    ratios["time_bf16_over_fp32_chunked"] = med[("chunked", "bf16")][0] / med[("chunked", "fp32")][0]
    print(result_line("logprob_head", **ratios))


if __name__ == "__main__":
    main()
