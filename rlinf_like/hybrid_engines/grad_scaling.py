"""fp16 training needs loss scaling: fp16 gradients underflow where bf16's do not. One helper pair
for the managers: `backward` scales the loss, `optimizer_step` unscales, clips, and steps only on
finite gradients, letting the scaler lower its scale after an overflow (and raise it after
`growth_interval` clean steps). Without a scaler (fp32, bf16) the same calls do the plain thing.

Under data parallelism the scaler is FSDP's `ShardedGradScaler`: each rank sees only its shard of the
gradients, and the scaler all-reduces "found inf" so that every rank skips, and rescales, together.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.distributed as dist

GradScaler = torch.amp.GradScaler


def make_grad_scaler(precision: str, device: torch.device, init_scale: float = 2.0**16) -> GradScaler | None:
    """A scaler for fp16, None for every other precision."""
    if precision != "fp16":
        return None
    if dist.is_initialized():
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device=device.type, init_scale=init_scale)
    return torch.amp.GradScaler(device.type, init_scale=init_scale)


def backward(loss: torch.Tensor, scaler: GradScaler | None) -> None:
    (scaler.scale(loss) if scaler is not None else loss).backward()


def optimizer_step(optimizer: torch.optim.Optimizer, params: Iterable[torch.nn.Parameter], max_norm: float,
                   scaler: GradScaler | None) -> tuple[float, bool]:
    """Unscale, clip to `max_norm` and step unless the gradient norm is non-finite.
    Returns (the unscaled gradient norm, skipped)."""
    if scaler is not None:
        scaler.unscale_(optimizer)
    norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm)
    norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    skipped = not math.isfinite(norm)
    if scaler is not None:
        if not skipped:
            scaler.step(optimizer)
        scaler.update()  # after an overflow: scale * backoff_factor
    elif not skipped:
        optimizer.step()
    return norm, skipped
