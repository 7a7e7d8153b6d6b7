"""Dynamic micro-batching by token budget, balanced over data-parallel ranks.

A mini-batch (every rank holds all of it) is cut into `world_size x k` micro-batches of balanced
token counts, each within the budget, and dealt to the ranks so every rank runs the same number
`k` of micro-batches (each one is a collective under FSDP) and about the same number of tokens.
Pure functions of the mini-batch: every rank computes the same plan without communicating.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch

from rlinf_like.data.batch import Batch


def sequence_lengths(batch: Batch) -> torch.Tensor:
    """Real tokens per row (attention_mask sums; the full width without a mask)."""
    mask = batch.get("attention_mask")
    if mask is None:
        ids = batch["input_ids"]
        return torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long)
    return mask.sum(1).long()


def micro_batch_cost(lengths: Sequence[int], packed: bool) -> int:
    """Tokens the model computes on: the real ones when packed, rows x longest when padded."""
    return sum(lengths) if packed else len(lengths) * max(lengths, default=0)


def balanced_partition(weights: Sequence[int], parts: int) -> list[list[int]]:
    """Longest-processing-time greedy: heaviest item first into the lightest part. With at least
    `parts` items no part is empty. Returns item indices per part (ascending)."""
    heap = [(0, p) for p in range(parts)]
    out: list[list[int]] = [[] for _ in range(parts)]
    for i in sorted(range(len(weights)), key=lambda j: (-weights[j], j)):
        load, p = heapq.heappop(heap)
        out[p].append(i)
        heapq.heappush(heap, (load + weights[i], p))
    return [sorted(part) for part in out]


def token_budget_plan(lengths: Sequence[int], world_size: int, max_tokens: int,
                      packed: bool) -> list[list[list[int]]]:
    """Row indices per rank per micro-batch: the fewest micro-batches per rank `k` such that a
    balanced split into `world_size * k` parts keeps every part's cost within `max_tokens`."""
    lengths = [int(n) for n in lengths]
    if max_tokens <= 0:
        raise ValueError(f"max_tokens_per_micro_batch must be > 0, got {max_tokens}")
    if lengths and max(lengths) > max_tokens:
        raise ValueError(f"max_tokens_per_micro_batch={max_tokens} is smaller than a sequence of {max(lengths)} "
                         f"tokens; raise it to at least the longest sequence")
    rows = len(lengths)
    if rows < world_size:
        raise ValueError(f"a mini-batch of {rows} rows cannot give each of {world_size} ranks a micro-batch")
    k = max(1, -(-sum(lengths) // (world_size * max_tokens)))
    while True:
        if world_size * k > rows:
            raise ValueError(f"max_tokens_per_micro_batch={max_tokens}: {rows} rows cannot fill {world_size} ranks x "
                             f"{k} micro-batches; raise the budget or the mini-batch size")
        parts = balanced_partition(lengths, world_size * k)
        if all(micro_batch_cost([lengths[i] for i in p], packed) <= max_tokens for p in parts):
            break
        k += 1
    # deal the parts heaviest first in snake order: rank totals stay balanced
    parts.sort(key=lambda p: (-sum(lengths[i] for i in p), p))
    plan: list[list[list[int]]] = [[] for _ in range(world_size)]
    for j, part in enumerate(parts):
        lap, pos = divmod(j, world_size)
        plan[pos if lap % 2 == 0 else world_size - 1 - pos].append(part)
    return plan


def trim_padding(batch: Batch) -> Batch:
    """Drop the columns right of the longest row: per-token tensors are [B, T] or [B, T-1]."""
    width = batch["input_ids"].shape[1]
    keep = int(sequence_lengths(batch).max()) if width else 0
    if keep == width:
        return batch
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] in (width, width - 1):
            value = value[:, :keep - (width - value.shape[1])]
        out[key] = value
    return out
