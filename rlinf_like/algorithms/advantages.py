"""Advantage estimators. Outcome-reward ones take rewards [groups, samples] (one scalar per
response, the n responses of a prompt in a row) and return per-response advantages of the same
shape; the runner broadcasts them over response tokens. Token-level ones take [batch, tokens]
with a response mask.
"""

from __future__ import annotations

import torch

from rlinf_like.algorithms.masked import masked_whiten
from rlinf_like.algorithms.registry import Registry

OUTCOME_ADVANTAGES: Registry = Registry("advantage estimator")


@OUTCOME_ADVANTAGES.register("grpo")
def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6, scale_by_std: bool = True) -> torch.Tensor:
    """GRPO: reward minus its group's mean, divided by the group's (sample) std unless
    `scale_by_std=False` (Dr. GRPO drops the division). A group of equal rewards gets 0."""
    centered = rewards - rewards.mean(dim=-1, keepdim=True)
    if not scale_by_std:
        return centered
    if rewards.shape[-1] < 2:
        return torch.zeros_like(rewards)
    return centered / (rewards.std(dim=-1, keepdim=True) + eps)


@OUTCOME_ADVANTAGES.register("rloo")
def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: reward minus the mean of the *other* samples of its group."""
    n = rewards.shape[-1]
    if n < 2:
        raise ValueError("rloo needs at least 2 samples per prompt")
    others_mean = (rewards.sum(dim=-1, keepdim=True) - rewards) / (n - 1)
    return rewards - others_mean


def reinforce_pp_advantages(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++: discounted return-to-go of token rewards (outcome reward on the last token, plus
    any per-token KL penalty), whitened over every valid token of the batch (no critic, no group)."""
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        running = (token_rewards[:, t] + gamma * running) * mask[:, t]  # padding adds nothing
        returns[:, t] = running
    return masked_whiten(returns, mask)


def gae(
    rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0, lam: float = 0.95,
    last_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over [batch, T]. `mask` marks valid steps; past the last
    valid step nothing is bootstrapped unless `last_values` (per row, e.g. a truncated episode's
    value estimate) is given. Returns (advantages, returns = advantages + values)."""
    batch, steps = rewards.shape
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros(batch, dtype=rewards.dtype) if last_values is None else last_values
    next_advantage = torch.zeros(batch, dtype=rewards.dtype)
    for t in reversed(range(steps)):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        valid = mask[:, t].bool()
        advantages[:, t] = torch.where(valid, advantage, torch.zeros_like(advantage))
        # an invalid (padding) step passes the bootstrap through unchanged
        next_value = torch.where(valid, values[:, t], next_value)
        next_advantage = torch.where(valid, advantage, next_advantage)
    return advantages, (advantages + values) * mask
