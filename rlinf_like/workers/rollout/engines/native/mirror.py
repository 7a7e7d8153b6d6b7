"""A dense copy of the live sequences' keys and values, kept across decode steps while the batch is unchanged.

A decode step over the paged cache gathers every live sequence's rows, every layer, every step: on CPU that copy
was ~17% of a step's time on the tiny model (the bytes a step reads, copied once more). While the same sequences
decode step after step, the gathered rows only grow by one position per sequence, so the mirror keeps them:
[layers, kv_heads, batch, head_dim, width] for keys (stored transposed: the score product reads them in that order)
and [layers, kv_heads, batch, width, head_dim] for values, built with one gather when the batch changes (an
admission, a finish, a preemption: the scheduler's roster) or outgrows its width, then appended in place each step
(the paged cache is written too; it stays the source of truth).

Attention reads the whole width, `padded_span` of the longest sequence (a multiple of `GROW`), not a slice of it: a
batched matmul on a slice copies it first (a bf16 one does even for a plain stride), and on CPU those copies of
cold memory cost more than the products (at batch 128: ~60 of ~260 ms a step on SmolLM2). The per-step gather
reads the same padded width, so both paths multiply the same shapes: the same bits. Positions past a sequence's own
length hold zeros or other cache rows (finite, masked). A rebuild reuses the last buffer when it is large enough.
The mirror is used only while it fits in `limit_bytes` (the paged cache's size: at most doubling the KV memory);
otherwise the step gathers.
"""

from __future__ import annotations

import math

import torch

GROW = 32  # positions per width step: attention wastes < GROW columns a row; a stable batch rebuilds every GROW steps


def padded_span(span: int, limit: int) -> int:
    """The width attention reads for a longest sequence of `span` positions: `span` rounded up to a multiple of
    GROW, at most `limit` (the block table's positions)."""
    return min(-(-span // GROW) * GROW, limit)


class DecodeMirror:
    def __init__(self) -> None:
        self.key: object = None
        self.positions: torch.Tensor | None = None
        self.k: torch.Tensor | None = None  # [layers, kv, B, d, capacity]
        self.v: torch.Tensor | None = None  # [layers, kv, B, capacity, d]
        self.batch: torch.Tensor | None = None  # arange(B)

    def drop(self) -> None:
        self.key = self.positions = self.k = self.v = None

    def ready(self, key: object, positions: torch.Tensor, width: int, k_cache: torch.Tensor, v_cache: torch.Tensor,
              table: torch.Tensor, block_size: int, limit_bytes: int) -> bool:
        """Make the mirror hold rows 0 .. position - 1 of each sequence in the batch (table [B, blocks],
        positions [B]) in `width` positions (`padded_span` of the longest, which the caller knows); False when it
        would not fit in `limit_bytes` (then the caller gathers)."""
        if (self.k is not None and key is not None and key == self.key and width == self.k.shape[4]
                and torch.equal(positions, self.positions + 1)):
            self.positions = positions
            return True
        self.key = None
        layers, kv, _, d = k_cache.shape
        b = positions.shape[0]
        if 2 * layers * kv * b * width * d * k_cache.element_size() > limit_bytes or key is None:
            self.drop()
            return False
        blocks = -(-width // block_size)
        offsets = torch.arange(block_size, device=table.device)
        rows = (table[:, :blocks, None] * block_size + offsets).view(b, -1)[:, :width].reshape(-1)  # [B * width]
        self.k = self._buffer(self.k, k_cache, (layers, kv, b, d, width))
        self.v = self._buffer(self.v, v_cache, (layers, kv, b, width, d))
        # rows past a sequence's position are other cache rows (finite, masked), as the per-step gather reads
        self.k.copy_(k_cache.index_select(2, rows).view(layers, kv, b, width, d).transpose(-1, -2))
        self.v.copy_(v_cache.index_select(2, rows).view(layers, kv, b, width, d))
        self.key, self.positions = key, positions
        self.batch = torch.arange(b, device=positions.device)
        return True

    @staticmethod
    def _buffer(old: torch.Tensor | None, like: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """The last buffer's memory when it is large enough (a rebuild then allocates nothing: fresh pages would
        fault on CPU), else zeros; either way every value is finite."""
        numel = math.prod(shape)
        if old is None or old.untyped_storage().nbytes() < numel * old.element_size():
            return like.new_zeros(shape)
        whole = torch.empty(0, dtype=old.dtype, device=old.device).set_(old.untyped_storage())  # 1-D, all of it
        return whole[:numel].view(shape)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's k, v [B, kv, d] at each sequence's position; keys [kv, B, d, width] (transposed) and
        values [kv, B, width, d], whole (contiguous)."""
        k_layer, v_layer = self.k[layer], self.v[layer]
        k_layer[:, self.batch, :, self.positions] = k  # the indexed dims are apart: the result is [B, kv, d]
        v_layer[:, self.batch, self.positions] = v.transpose(0, 1)
        return k_layer, v_layer
