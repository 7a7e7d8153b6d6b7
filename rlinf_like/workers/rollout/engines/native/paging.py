"""The native engine's paged KV cache: its size from a memory budget, and the pool of blocks.

The cache is cut into blocks of `rollout.kv_block_size` tokens. A sequence takes a block when it
grows into it, so a short sequence holds only the blocks it fills, not `max_context` tokens. The
blocks of a prompt that its n samples fill whole are shared by them (counted references); each
sample has its own copy of the prompt's last, partly filled block and of everything after it.

How many blocks: `rollout.kv_cache_memory_gb` GiB, or when that is 0 `rollout.kv_cache_memory_fraction`
of the memory free at start-up (host RAM on CPU, the GPU's free memory on CUDA), as vLLM's and
SGLang's memory fractions do; never more than every batch slot at `max_context` could use. Block 0
is a scratch block that no sequence owns. A budget that cannot hold one sequence of `max_context`
tokens is refused at start-up, naming the key.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import psutil
import torch

log = logging.getLogger(__name__)

GIB = 1 << 30


@dataclass(frozen=True)
class CachePlan:
    budget_bytes: int  # what the config allows
    source: str  # where the budget came from, for the log
    block_size: int  # tokens per block
    block_bytes: int  # bytes one block takes (keys + values, all layers, this rank's heads)
    blocks: int  # blocks allocated, the scratch block included

    @property
    def max_tokens(self) -> int:
        """Tokens the cache holds at once, over all sequences (the scratch block excluded)."""
        return (self.blocks - 1) * self.block_size

    def describe(self) -> str:
        return (f"KV cache: budget {self.budget_bytes / GIB:.3f} GiB ({self.source}), {self.blocks - 1} blocks of "
                f"{self.block_size} tokens ({self.blocks * self.block_bytes / GIB:.3f} GiB allocated), at most "
                f"{self.max_tokens} tokens in flight")


def free_memory(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def cache_budget(memory_gb: float, memory_fraction: float, device: torch.device) -> tuple[int, str]:
    """Bytes the KV cache may take, and where that figure came from (for the log and errors)."""
    if memory_gb > 0:
        return int(memory_gb * GIB), f"rollout.kv_cache_memory_gb={memory_gb:g}"
    free = free_memory(device)
    return (int(memory_fraction * free),
            f"rollout.kv_cache_memory_fraction={memory_fraction:g} of {free / GIB:.2f} GiB free ({device.type})")


def plan_cache(*, budget: int, source: str, block_size: int, token_bytes: int, max_context: int,
               slots: int) -> CachePlan:
    """Blocks for the budget; refuses a budget that cannot hold one sequence of `max_context` tokens."""
    block_bytes = block_size * token_bytes
    per_sequence = -(-max_context // block_size)
    affordable = budget // block_bytes - 1  # the scratch block comes first
    if affordable < per_sequence:
        need = (per_sequence + 1) * block_bytes
        raise ValueError(
            f"native engine: the KV cache budget of {budget / GIB:.4f} GiB ({source}) holds {max(affordable, 0)} "
            f"blocks of {block_size} tokens, fewer than one sequence of max_context={max_context} tokens needs "
            f"({per_sequence}); raise rollout.kv_cache_memory_gb to at least {need / GIB:.4f} or lower "
            f"rollout.max_context")
    blocks = 1 + min(affordable, slots * per_sequence)
    return CachePlan(budget, source, block_size, block_bytes, blocks)


class BlockPool:
    """Free blocks and reference counts; block 0 (scratch) is never handed out."""

    def __init__(self, blocks: int):
        self.refs = [0] * blocks
        self._free = list(range(blocks - 1, 0, -1))  # pop() hands out low numbers first

    @property
    def available(self) -> int:
        return len(self._free)

    @property
    def in_use(self) -> int:
        """Blocks some sequence holds (the scratch block excluded)."""
        return len(self.refs) - 1 - self.available

    def take(self) -> int:
        block = self._free.pop()
        self.refs[block] = 1
        return block

    def share(self, block: int) -> None:
        self.refs[block] += 1

    def release(self, blocks: list[int]) -> None:
        for block in blocks:
            self.refs[block] -= 1
            if self.refs[block] == 0:
                self._free.append(block)
