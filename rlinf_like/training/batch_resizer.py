"""The pipeline mode's batch-resizing iterator: streamed pieces (e.g. rollout groups arriving on a
Channel, each a right-padded Batch) are gathered into global batches of exactly `global_rows` rows,
hooks run on each whole global batch (advantages need every sample of a group; normalisation needs
the whole batch), and each global batch is cut into this rank's token-budget micro-batches with
their loss scales (the same plan as `training/loop.py`, so every rank runs the same count).

    resizer = BatchResizer(channel, global_rows=256, hooks=[add_advantages], rank=r, world_size=w,
                           loop=LoopConfig(max_tokens_per_micro_batch=4096, pack_sequences=True))
    run_steps(manager, resizer, loss_fn)  # training/loop.py: the one training loop

A streaming trainer can iterate it directly; the reasoning runner's pipelined schedule takes whole groups off
its channel and plans each actor rank's steps with `plan_steps`, the plan this class makes
(runners/reasoning/schedules/pipelined.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import torch

from rlinf_like.data.batch import Batch, select_rows
from rlinf_like.training.loop import LoopConfig, loss_tokens, num_rows, plan_steps

Hook = Callable[[Batch], Batch]


def concat_batches(pieces: Sequence[Batch]) -> Batch:
    """Rows of several right-padded batches in one, per-token tensors right-padded with 0 to the widest
    piece ([B, T] and [B, T-1] tensors keep their offset of one)."""
    width = max(p["input_ids"].shape[1] for p in pieces)
    out = {}
    for key in pieces[0]:
        parts = []
        for p in pieces:
            value = p[key]
            if value.dim() >= 2:
                short = width - p["input_ids"].shape[1]
                value = torch.nn.functional.pad(value, (0, 0) * (value.dim() - 2) + (0, short))
            parts.append(value)
        out[key] = torch.cat(parts)
    return out


class BatchResizer:
    def __init__(self, source: Iterable[Batch], global_rows: int, hooks: Sequence[Hook] = (), *, rank: int = 0,
                 world_size: int = 1, loop: LoopConfig | None = None, weigh: Callable[[Batch], float] = loss_tokens):
        if global_rows < world_size:
            raise ValueError(f"batch resizer: global_rows={global_rows} must be >= world_size={world_size}")
        self.loop = loop or LoopConfig(max_tokens_per_micro_batch=None)
        if self.loop.max_tokens_per_micro_batch is None:
            raise ValueError("batch resizer: loop.max_tokens_per_micro_batch must be set (micro-batches by token budget)")
        self.source, self.global_rows, self.hooks = iter(source), global_rows, list(hooks)
        self.rank, self.world_size, self.weigh = rank, world_size, weigh
        self._held: list[Batch] = []  # rows received beyond the last global batch

    def global_batches(self) -> Iterator[Batch]:
        """Exactly `global_rows` rows each, hooks applied; a short tail at the end of the source is dropped."""
        rows = sum(num_rows(b) for b in self._held)
        for piece in self.source:
            self._held.append(piece)
            rows += num_rows(piece)
            while rows >= self.global_rows:
                merged = concat_batches(self._held)
                batch = select_rows(merged, slice(0, self.global_rows))
                rest = select_rows(merged, slice(self.global_rows, None))
                self._held, rows = ([rest] if num_rows(rest) else []), rows - self.global_rows
                for hook in self.hooks:
                    batch = hook(batch)
                yield batch

    def rank_steps(self, batch: Batch, rank: int, step: int) -> list[list[tuple[Batch, float]]]:
        """Rank `rank`'s (micro-batch, loss scale) pairs per optimizer step for a global batch, every
        epoch: the plan `train_epochs` makes for the same batch at optimizer step `step`."""
        return list(plan_steps(batch, rank, self.world_size, self.loop, step, weigh=self.weigh))

    def __iter__(self) -> Iterator[list[tuple[Batch, float]]]:
        """Per optimizer step (`loop.epochs x loop.mini_batches` per global batch): this rank's
        (micro-batch, loss scale) pairs, as many on every rank."""
        step = 0
        for batch in self.global_batches():
            yield from self.rank_steps(batch, self.rank, step)
            step += self.loop.epochs * self.loop.mini_batches
