"""REINFORCE++: return-to-go of per-token rewards, whitened over the batch (no critic, no groups)."""

from __future__ import annotations

import torch

from rlinf_like.algorithms.advantage_estimators.base import (
    ADVANTAGE_ESTIMATORS,
    AdvantageEstimator,
    AdvantageInputs,
    Advantages,
    outcome_token_rewards,
)
from rlinf_like.algorithms.masked import masked_whiten


def reinforce_pp_advantages(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Discounted return-to-go of token rewards (outcome on the last token, plus any per-token KL
    penalty), whitened over every valid token of the batch. A masked step (padding; a multi-turn response's
    tool tokens) adds nothing and passes the return through undiscounted, so an earlier turn's tokens get the
    return of the turns after them."""
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        valid = mask[:, t] > 0
        running = torch.where(valid, token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running * mask[:, t]
    return masked_whiten(returns, mask)


@ADVANTAGE_ESTIMATORS.register("reinforce_pp")
class ReinforcePP(AdvantageEstimator):
    token_level = True
    accepts_kl_in_reward = True

    def estimate(self, inputs: AdvantageInputs) -> Advantages:
        mask = inputs.response_mask
        token_rewards = outcome_token_rewards(inputs.rewards, mask, inputs.kl_penalty)
        return Advantages(advantages=reinforce_pp_advantages(token_rewards, mask))
