"""ModelManager: the one training-engine interface behind which FSDP and Megatron sit.

The caller owns the loop (gradient accumulation, when to step, what loss); the manager owns
parallelism, precision, gradient sync, residency and checkpoints:

    for i, micro in enumerate(micro_batches):
        manager.forward_backward(micro, loss_fn, loss_scale=1 / len(micro_batches),
                                 sync_gradients=i == len(micro_batches) - 1)
    metrics = manager.optim_step()          # {"grad_norm", "lr", "skipped"}

A loss function takes (model, batch) and returns (scalar loss, metrics); `token_logprobs` is
the shared building block for language models, so algorithm code never touches full logits.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlinf_like.data.batch import read_mask, shard_rows
from rlinf_like.hybrid_engines import head_stats, routing_replay
from rlinf_like.hybrid_engines.lora_sync import AdapterSpec
from rlinf_like.hybrid_engines.packing import Packing, pack_batch
from rlinf_like.hybrid_engines.prompt_sharing import share_batch
from rlinf_like.hybrid_engines.reshard.layout import TensorLayout
from rlinf_like.hybrid_engines.residency import PARTS, MoveStats, ResidencyManager

Batch = Mapping[str, Any]  # tensors, plus an optional "packing": Packing
LossFn = Callable[[nn.Module, Batch], tuple[torch.Tensor, dict[str, float]]]


@dataclass
class OptimConfig:
    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.0
    clip_grad: float | None = 1.0  # None: no clipping (the norm is still reported)


def swap_checkpoint_into_place(tmp: Path, final: Path) -> None:
    """Rename a complete checkpoint written to `tmp` over `final`, so that at every moment one
    complete checkpoint exists under `final` or `final.old` (a crash mid-save loses nothing)."""
    old = Path(f"{final}.old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    if old.exists():
        shutil.rmtree(old)


def model_logits(model: nn.Module, batch: Batch) -> torch.Tensor:
    """Logits of an HF causal LM (output with .logits) or a plain module returning a tensor, in the
    batch's padded layout [B, T, V] (a packed batch is run packed, then unpacked)."""
    packing = batch.get("packing")
    if packing is not None:
        return packing.unpack(_packed_logits(model, packing))
    out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
    return out.logits if hasattr(out, "logits") else out


def _packed_logits(model: nn.Module, packing: Packing) -> torch.Tensor:
    # no 2-D mask: the model derives the block-diagonal causal mask from the restarting position ids
    # (and no KV cache: transformers skips the packing detection when one exists)
    out = model(input_ids=packing.input_ids, position_ids=packing.position_ids, use_cache=False)
    return out.logits if hasattr(out, "logits") else out


def token_stats(model: nn.Module, batch: Batch, temperature: float = 1.0, entropy_grad: bool | None = None,
                chunk_bytes: int = head_stats.CHUNK_BYTES) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token logprobs [B, T-1] (position t: log p(token t+1 | tokens <= t)) and, unless
    `entropy_grad` is None, the entropy of each next-token distribution (with gradient when True).
    With a "packing" entry the model runs on the packed rows and the softmax covers real tokens
    only; positions whose next token is padding are then 0 (every loss masks them).

    When the batch's fp32 logits would exceed `chunk_bytes`, an HF causal LM's output layer runs only at the
    positions a loss reads (`response_mask`, else `loss_mask`, else the non-padding tokens), `chunk_bytes` of
    logits at a time (hybrid_engines/head_stats.py); the other positions are 0. Smaller batches take one plain
    pass over every position. An optional "grad_mask" [B, T-1] names the positions whose numbers the caller will
    differentiate: on the output-layer paths the others are computed without a gradient."""
    if routing_replay.installed(model):  # a MoE actor: replay the batch's routes, or record its own
        routing_replay.prepare(model, batch)
    if batch.get("shared_prompts") is not None:
        return _shared_token_stats(model, batch, temperature, entropy_grad, chunk_bytes)
    packing = batch.get("packing")
    ids = batch["input_ids"] if packing is None else packing.input_ids
    head = head_stats.output_head(model)
    if head is not None and ids.numel() * head.out_features * 4 > chunk_bytes:
        return _chunked_token_stats(model, batch, head, temperature, entropy_grad, chunk_bytes)
    if packing is None:
        logits, targets = model_logits(model, batch)[:, :-1].float(), ids[:, 1:]
    else:
        logits, targets = _packed_logits(model, packing)[:, :-1].float(), ids[:, 1:]
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logprobs = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if entropy_grad is not None:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            entropy = -(logp_all.exp() * logp_all).sum(-1)
    if packing is not None:
        logprobs = packing.unpack_next(logprobs)
        entropy = None if entropy is None else packing.unpack_next(entropy)
    return logprobs, entropy


def _chunked_token_stats(model: nn.Module, batch: Batch, head: nn.Linear, temperature: float,
                         entropy_grad: bool | None, chunk_bytes: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    packing = batch.get("packing")
    entropy = "none" if entropy_grad is None else ("grad" if entropy_grad else "value")
    rows = head_stats.chunk_rows(head.out_features, chunk_bytes)
    if packing is None:
        ids, mask = batch["input_ids"], read_mask(batch)
        positions = torch.ones_like(ids[:, 1:], dtype=torch.bool) if mask is None else mask.bool().to(ids.device)
    else:  # packed rows hold real tokens only: every position is read
        ids = packing.input_ids
        positions = torch.ones_like(ids[:, 1:], dtype=torch.bool)
    with head_stats.stats_head(model, head, ids[:, 1:], positions, temperature, entropy, rows,
                               graded=batch.get("grad_mask") if packing is None else None):
        stats = model_logits(model, batch) if packing is None else _packed_logits(model, packing)
    logprobs, ent = stats[:, :-1, 0], (stats[:, :-1, 1] if entropy != "none" else None)
    if packing is not None:
        logprobs = packing.unpack_next(logprobs)
        ent = None if ent is None else packing.unpack_next(ent)
    return logprobs, ent


def _shared_token_stats(model: nn.Module, batch: Batch, temperature: float, entropy_grad: bool | None,
                        chunk_bytes: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`token_stats` over the batch's groups laid out with one prompt each (hybrid_engines/prompt_sharing.py): the
    output layer runs at the positions a loss reads only, taken from the laid-out hidden states."""
    shared = batch["shared_prompts"]
    head = head_stats.output_head(model)
    if head is None:
        raise ValueError("shared prompts need an HF causal LM with a plain linear output layer")
    entropy = "none" if entropy_grad is None else ("grad" if entropy_grad else "value")
    ids, mask = batch["input_ids"], read_mask(batch)
    positions = (torch.ones_like(ids[:, 1:], dtype=torch.bool) if mask is None else mask.bool()).to(ids.device)
    positions = positions & (shared.source[:, 1:] >= 0)  # a read position's next token is in the row
    rows = head_stats.chunk_rows(head.out_features, chunk_bytes)
    dtype = next(model.parameters()).dtype
    with head_stats.stats_head(model, head, ids[:, 1:], positions, temperature, entropy, rows,
                               shared.sources(positions), batch.get("grad_mask")):
        out = model(input_ids=shared.input_ids, position_ids=shared.position_ids,
                    attention_mask=shared.attention_mask(model, dtype), use_cache=False)
    stats = out.logits if hasattr(out, "logits") else out
    return stats[:, :-1, 0], (stats[:, :-1, 1] if entropy != "none" else None)


def token_logprobs(model: nn.Module, batch: Batch, temperature: float = 1.0) -> torch.Tensor:
    """log p(token_t | tokens_<t) for t = 1..T-1, shape [B, T-1]; logits never leave this function."""
    return token_stats(model, batch, temperature)[0]


def logprobs_by_length(compute: Callable[[Batch], torch.Tensor], batch: Batch, lengths: list[int]) -> torch.Tensor:
    """`compute`'s logprobs of a right-padded batch, one forward per row length, each over that length's rows
    and no padding: a row's numbers then depend on its own tokens only. A padded forward runs attention over
    the batch's longest length, and on CPU that changes the last bits of a row's logprobs; the native engine's
    rescoring runs each sequence unpadded, so in fp32 the two agree bit for bit (docs/benchmarks/exactness.md).
    `lengths` are the whole batch's (every rank's), so every rank runs the same forwards, as FSDP's collective
    parameter gathers need: a length this rank has no row of runs on a dummy row. Padding positions are 0."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    own = mask.sum(1)
    out = torch.zeros(ids.shape[0], ids.shape[1] - 1)
    for length in sorted(lengths):
        rows = (own == length).nonzero()[:, 0]
        if len(rows) == 0:
            compute({"input_ids": torch.zeros(1, length, dtype=ids.dtype), "attention_mask": torch.ones(1, length,
                                                                                                     dtype=mask.dtype)})
            continue
        out[rows, : length - 1] = compute({"input_ids": ids[rows, :length], "attention_mask": mask[rows, :length]})
    return out


def token_nll_loss(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean negative log-likelihood over `loss_mask` (default: attention_mask, else all tokens)."""
    logprobs = token_logprobs(model, batch)
    mask = batch.get("loss_mask", batch.get("attention_mask"))
    mask = torch.ones_like(logprobs) if mask is None else mask[:, 1:].to(logprobs.dtype)
    loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"tokens": float(mask.sum())}


@dataclass(frozen=True)
class DataParallelRank:
    """Where a rank sits among the data-parallel replicas: which rows of a batch it trains on. The ranks
    of one replica (tensor / pipeline parallel) see the same rows; `first` marks the one rank per
    replica whose per-row results (logprobs) a caller keeps, so replicas' rows are counted once."""
    rank: int
    size: int
    first: bool = True


@dataclass
class ManagerStatus:
    step: int
    lr: float
    world_size: int
    offloaded: dict[str, bool]
    device_bytes: dict[str, int]
    last_moves: list[MoveStats] = field(default_factory=list)


class ModelManager(ABC):
    model: nn.Module
    optimizer: torch.optim.Optimizer
    residency: ResidencyManager
    step: int  # optimizer steps taken
    rank: int
    world_size: int

    @abstractmethod
    def forward_backward(
        self, batch: Batch, loss_fn: LossFn | None = None, *, loss_scale: float = 1.0, sync_gradients: bool = True
    ) -> dict[str, float]: ...

    @abstractmethod
    def optim_step(self) -> dict[str, float]: ...

    @abstractmethod
    def clear_gradients(self) -> None: ...

    @abstractmethod
    def compute_logprobs(self, batch: Batch, temperature: float = 1.0) -> torch.Tensor: ...

    @abstractmethod
    def save(self, path: str) -> None: ...

    @abstractmethod
    def load(self, path: str) -> None: ...

    @abstractmethod
    def export_hf(self, path: str) -> None: ...

    @abstractmethod
    def shard_layouts(self) -> list[TensorLayout]: ...

    @abstractmethod
    def named_shards(self) -> dict[str, torch.Tensor]: ...

    def accumulating(self) -> contextlib.AbstractContextManager:
        """Around one optimizer step's micro-batches (`forward_backward` calls with gradients on, nothing else):
        what a manager may keep from one micro-batch to the next. Default: nothing."""
        return contextlib.nullcontext()

    def changing_tensors(self) -> list[str] | None:
        """Names (as in `shard_layouts`) of the tensors a training step can change, when that is fewer than
        all of them (LoRA: the adapted weights); None: every tensor. A weight sync after the first sends only
        these."""
        return None

    def adapter_spec(self) -> AdapterSpec | None:
        """Under LoRA, what the rollout needs to merge the adapters it receives; None: full weights are sent."""
        return None

    @abstractmethod
    def get_config(self) -> dict[str, Any]: ...

    @abstractmethod
    def set_base_lr(self, lr: float) -> None:
        """Switch the base learning rate; the LR schedule keeps applying on top (at the current step)."""

    def data_parallel(self) -> DataParallelRank:
        """Every rank is its own data-parallel replica unless the backend splits a model over ranks."""
        return DataParallelRank(self.rank, self.world_size)

    def replica_logprobs(self, batch: Batch, temperature: float = 1.0, pack: bool = False,
                         max_batch_seqlen: int | None = None, by_length: bool = False,
                         share_pairs: float | None = None,
                         routes: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logprobs of this rank's data-parallel replica's rows of `batch` (run packed if `pack`, with shared
        prompts unless `share_pairs` is None (a `prompt_sharing.pair_cost`), or `by_length`: see
        `logprobs_by_length`). The replica's other ranks return no rows, so concatenating every rank's answer in
        rank order gives each row once, in batch order. `routes` (R2 routing replay): also the routes the
        model's own routers chose in this forward, rows as the logprobs' (`routing_replay.recorded_routes`)."""
        dp = self.data_parallel()
        mine = shard_rows(batch, dp.rank, dp.size)
        if routes:  # the trainer's own routes are what R2 records: none forced
            if by_length or share_pairs is not None:
                raise ValueError("recording routes needs one forward over rows laid out whole (no by_length, no "
                                 "shared prompts)")
            mine = {k: v for k, v in mine.items() if k != "routes"}
        if by_length:
            logprobs = logprobs_by_length(lambda b: self.compute_logprobs(b, temperature), mine,
                                          batch["attention_mask"].sum(1).unique().tolist())
        elif share_pairs is not None:
            logprobs = self.compute_logprobs(share_batch(mine, share_pairs), temperature)
        else:
            run = pack_batch(mine, max_batch_seqlen) if pack else mine
            logprobs = self.compute_logprobs(run, temperature)
            if routes:
                recorded = routing_replay.recorded_routes(self.model, run)
                return (logprobs, recorded) if dp.first else (logprobs[:0], recorded[:0])
        return logprobs if dp.first else logprobs[:0]

    def get_status(self) -> ManagerStatus:
        return ManagerStatus(
            step=self.step,
            lr=self.optimizer.param_groups[0]["lr"],
            world_size=self.world_size,
            offloaded={p: self.residency.is_offloaded(p) for p in PARTS},
            device_bytes={p: self.residency.device_bytes(p) for p in PARTS},
            last_moves=list(self.residency.history)[-len(PARTS):],
        )

    # residency is the same for every backend
    def offload(self, parts: Iterable[str] = PARTS) -> list[MoveStats]:
        return self.residency.offload(parts)

    def onload(self, parts: Iterable[str] = PARTS) -> list[MoveStats]:
        return self.residency.onload(parts)
