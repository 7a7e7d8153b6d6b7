"""Tokens/s of a training step, sequence-packed versus padded, same model and batch, one run.

A batch of rows with lengths uniform in [16, 512] (seeded) trains one step (forward, backward,
AdamW) through an FSDPModelManager (world size 1, gloo) with the project's token NLL loss:
padded as one [B, 512] batch, and packed (`pack_batch`, rows of at most `--max-batch-seqlen`
tokens; the model sees position ids and builds a block-diagonal causal mask, sdpa on CPU). Both
count the same real tokens. Repetitions alternate; medians. Last line: one JSON object.

    python bench/packing.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch
import torch.distributed as dist

from rlinf_like.hybrid_engines.fsdp import FSDPConfig, FSDPModelManager
from rlinf_like.hybrid_engines.model_manager import OptimConfig, token_nll_loss
from rlinf_like.hybrid_engines.packing import pack_batch


def build(hidden: int, layers: int, vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3, num_hidden_layers=layers,
                      num_attention_heads=max(hidden // 64, 1), num_key_value_heads=max(hidden // 128, 1),
                      max_position_embeddings=1024, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).float()


def make_batch(rows: int, lo: int, hi: int, vocab: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(lo, hi + 1, (rows,), generator=g)
    mask = (torch.arange(int(lengths.max()))[None] < lengths[:, None]).long()
    return {"input_ids": torch.randint(1, vocab, mask.shape, generator=g) * mask, "attention_mask": mask}


def step_seconds(manager: FSDPModelManager, batch) -> float:
    start = time.perf_counter()
    manager.forward_backward(batch, token_nll_loss)
    manager.optim_step()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller model and batch, 2 repetitions")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-batch-seqlen", type=int, default=512)
    args = parser.parse_args()
    if args.quick:
        args.rows, args.hidden, args.layers, args.reps = 16, 128, 2, 2
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    manager = FSDPModelManager(build(args.hidden, args.layers, args.vocab),
                               FSDPConfig(optim=OptimConfig(lr=1e-4, clip_grad=1.0)))
    padded = make_batch(args.rows, 16, 512, args.vocab)
    tokens = int(padded["attention_mask"].sum())
    packed = pack_batch(padded, args.max_batch_seqlen)
    rows_packed = packed["packing"].input_ids.shape
    step_seconds(manager, pack_batch(make_batch(4, 16, 64, args.vocab)))  # warm-up both paths
    step_seconds(manager, make_batch(4, 16, 64, args.vocab))
    times: dict[str, list[float]] = {"padded": [], "packed": []}
    for rep in range(args.reps):
        for name in (("padded", "packed") if rep % 2 == 0 else ("packed", "padded")):
            start = time.perf_counter()  # the packed side pays for its planning
            batch = padded if name == "padded" else pack_batch(padded, args.max_batch_seqlen)
            plan_s = time.perf_counter() - start
            times[name].append(plan_s + step_seconds(manager, batch))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"batch: {args.rows} rows, {tokens} real tokens; padded {tuple(padded['input_ids'].shape)} = "
          f"{padded['input_ids'].numel()} slots, packed {tuple(rows_packed)} = {rows_packed.numel()} slots")
    print(f"model: Llama hidden {args.hidden}, {args.layers} layers, vocab {args.vocab}; reps {args.reps} (alternating)")
    for name in ("padded", "packed"):
        print(f"{name:>7}: median {med[name]:.3f} s/step ({', '.join(f'{t:.3f}' for t in times[name])}), "
              f"{tokens / med[name]:.0f} tokens/s")
    dist.destroy_process_group()
    print(json.dumps({"bench": "packing", "speedup": round(med["padded"] / med["packed"], 3),
                      "padded_tokens_per_s": round(tokens / med["padded"], 1),
                      "packed_tokens_per_s": round(tokens / med["packed"], 1), "real_tokens": tokens,
                      "padded_slots": padded["input_ids"].numel(), "packed_slots": rows_packed.numel()}))


if __name__ == "__main__":
    main()
