"""GAE (PPO with a critic): per-token advantages from the critic's values, whitened; returns for the critic."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_like.algorithms.advantage_estimators.base import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    AdvantageInputs,
    Advantages,
    outcome_token_rewards,
)
from rlinf_like.algorithms.masked import masked_whiten
from rlinf_like.config.validate import bounded


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


@dataclass(kw_only=True)
class GAEOptions:
    gamma: float = bounded(1.0, ge=0, le=1)  # discount over response tokens
    lam: float = bounded(1.0, ge=0, le=1)  # 1 = Monte-Carlo return minus V (robust with a young critic); lower trusts V


@ADVANTAGE_ESTIMATORS.register("gae")
class GAE(AdvantageEstimator):
    embodied = True
    needs_critic = True
    token_level = True
    accepts_kl_in_reward = True
    Options = GAEOptions

    def estimate(self, inputs: AdvantageInputs) -> Advantages:
        mask, values = inputs.response_mask, inputs.values
        token_rewards = outcome_token_rewards(inputs.rewards, mask, inputs.kl_penalty)
        advantages, returns = gae(token_rewards, values, mask, self.options.gamma, self.options.lam)
        value_mean = float((values * mask).sum() / mask.sum())
        return Advantages(advantages=masked_whiten(advantages, mask), returns=returns,
                          metrics={"value_mean": value_mean})
