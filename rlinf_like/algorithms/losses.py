"""Per-token losses and their aggregation. Inputs are [batch, tokens] with a response mask.

Policy loss: PPO's clipped surrogate with separate low / high clip ranges (DAPO's "clip higher"),
an optional dual clip bounding the loss for negative advantages, and optional per-token weights (the
off-policy corrections of `offpolicy.py`: the rollout engine's logprobs differ from the trainer's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_like.algorithms.masked import masked_mean, masked_sum
from rlinf_like.algorithms.registry import Registry
from rlinf_like.config.validate import bounded

AGGREGATIONS: Registry = Registry("loss aggregation")
KL_ESTIMATORS: Registry = Registry("KL estimator")


@AGGREGATIONS.register("token-mean")
def token_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Every valid token of the batch weighs the same (long responses weigh more)."""
    return masked_mean(loss, mask)


@AGGREGATIONS.register("seq-mean-token-mean")
def seq_mean_token_mean(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each response's tokens, then over responses (the original GRPO)."""
    per_seq = masked_sum(loss, mask, dim=-1) / mask.sum(-1).clamp(min=1)
    return per_seq[mask.sum(-1) > 0].mean() if bool((mask.sum(-1) > 0).any()) else loss.sum() * 0


@AGGREGATIONS.register("seq-mean-token-sum")
def seq_mean_token_sum(loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sum over each response's tokens, mean over responses."""
    return masked_sum(loss, mask, dim=-1).mean()


@KL_ESTIMATORS.register("k1")
def kl_k1(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """log pi - log ref: unbiased, can be negative per token."""
    return logprobs - ref_logprobs


@KL_ESTIMATORS.register("k2")
def kl_k2(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """(log pi - log ref)^2 / 2: biased, always >= 0."""
    return 0.5 * (logprobs - ref_logprobs) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """exp(ref - pi) - (ref - pi) - 1: unbiased and >= 0 (Schulman's k3, GRPO's choice)."""
    log_ratio = (ref_logprobs - logprobs).clamp(-20.0, 20.0)  # keep exp finite
    return torch.exp(log_ratio) - log_ratio - 1


@dataclass(kw_only=True)
class PolicyLossConfig:
    clip_low: float = bounded(0.2, ge=0)  # PPO ratio clip below 1 - clip_low
    # PPO ratio clip above 1 + clip_high (clip-higher when > clip_low; DAPO uses 0.28)
    clip_high: float = bounded(0.2, ge=0)
    dual_clip: float | None = bounded(None, gt=1)  # dual-clip bound c > 1 for negative advantages; null = off
    aggregation: str = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum (AGGREGATIONS)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: PolicyLossConfig = PolicyLossConfig(),
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate loss (to minimise) and metrics: clip fraction, approx KL to the old policy."""
    if config.dual_clip is not None and config.dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {config.dual_clip}")
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
    loss = torch.maximum(unclipped, clipped)
    if config.dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * config.dual_clip), loss)
    if is_weights is not None:
        loss = loss * is_weights
    total = AGGREGATIONS.get(config.aggregation)(loss, mask)
    with torch.no_grad():
        metrics = {
            "clip_fraction": float(masked_mean((clipped > unclipped).float(), mask)),
            "approx_kl": float(masked_mean(0.5 * log_ratio**2, mask)),
            "ratio_max": float(ratio[mask.bool()].max()) if bool(mask.any()) else 1.0,
        }
    return total, metrics


def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, clip: float | None = 0.2
) -> torch.Tensor:
    """PPO critic loss: 0.5 * max((v - R)^2, (clip(v) - R)^2), token-mean."""
    loss = (values - returns) ** 2
    if clip is not None:
        clipped = old_values + (values - old_values).clamp(-clip, clip)
        loss = torch.maximum(loss, (clipped - returns) ** 2)
    return 0.5 * masked_mean(loss, mask)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of softmax(logits) [..., V] -> [...]."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)
