"""The one training loop every trained role runs (actor, critic): epochs x mini-batches, one
optimizer step per mini-batch, micro-batches accumulating gradients inside it with only the last
one syncing them. The manager owns parallelism; the loss function owns the algorithm."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_like.data.batch import Batch, select_rows, shard_rows
from rlinf_like.hybrid_engines.model_manager import LossFn, ModelManager


@dataclass
class LoopConfig:
    mini_batches: int = 1  # optimizer steps per batch and epoch
    micro_batch_size: int | None = 64  # rows per forward/backward (per rank); None: a mini-batch in one pass
    epochs: int = 1  # passes over each batch
    seed: int = 0


def num_rows(batch: Batch) -> int:
    return next(iter(batch.values())).shape[0]


def micro_batches(batch: Batch, size: int | None) -> list[Batch]:
    n = num_rows(batch)
    size = size or max(n, 1)
    return [select_rows(batch, slice(i, i + size)) for i in range(0, n, size)]


def train_epochs(manager: ModelManager, batch: Batch, loss_fn: LossFn, rank: int, world_size: int,
                 loop: LoopConfig, epochs: int | None = None) -> dict[str, float]:
    """Train this data-parallel rank on its rows of `batch`; returns metrics averaged over steps.
    Every rank must run the same number of micro-batches (each is a collective under FSDP): the
    runner checks that the rows divide by world_size x mini_batches before launching."""
    mine = shard_rows(batch, rank, world_size)
    rows = num_rows(mine)
    totals: dict[str, float] = {}
    steps = 0
    # the shuffle depends on the optimizer step only, so a resumed run replays the same order
    generator = torch.Generator().manual_seed(loop.seed * 1000 + manager.step)
    for _ in range(loop.epochs if epochs is None else epochs):
        order = torch.randperm(rows, generator=generator)
        for mini in order.tensor_split(loop.mini_batches):  # always that many pieces (chunk may give fewer)
            micros = micro_batches(select_rows(mine, mini), loop.micro_batch_size)
            for i, micro in enumerate(micros):
                metrics = manager.forward_backward(micro, loss_fn, loss_scale=1 / len(micros),
                                                   sync_gradients=i == len(micros) - 1)
                for k, v in metrics.items():
                    totals[k] = totals.get(k, 0.0) + v / len(micros)
            for k, v in manager.optim_step().items():
                totals[k] = totals.get(k, 0.0) + v
            steps += 1
    return {k: v / steps for k, v in totals.items()}
