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

import os
import shutil
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rlinf_like.hybrid_engines.reshard.layout import TensorLayout
from rlinf_like.hybrid_engines.residency import PARTS, MoveStats, ResidencyManager

Batch = Mapping[str, torch.Tensor]
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
    """Logits of an HF causal LM (output with .logits) or a plain module returning a tensor."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch.get("attention_mask"))
    return out.logits if hasattr(out, "logits") else out


def token_logprobs(model: nn.Module, batch: Batch, temperature: float = 1.0) -> torch.Tensor:
    """log p(token_t | tokens_<t) for t = 1..T-1, shape [B, T-1]; logits never leave this function."""
    logits = model_logits(model, batch)[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = batch["input_ids"][:, 1:]
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def token_nll_loss(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean negative log-likelihood over `loss_mask` (default: attention_mask, else all tokens)."""
    logprobs = token_logprobs(model, batch)
    mask = batch.get("loss_mask", batch.get("attention_mask"))
    mask = torch.ones_like(logprobs) if mask is None else mask[:, 1:].to(logprobs.dtype)
    loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1)
    return loss, {"tokens": float(mask.sum())}


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

    @abstractmethod
    def get_config(self) -> dict[str, Any]: ...

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
