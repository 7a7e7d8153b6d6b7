"""RLOO (REINFORCE leave-one-out): each response's reward against the mean of the other samples of its group."""

from __future__ import annotations

import torch

from rlinf_like.algorithms.advantage_estimators.base import ADVANTAGE_ESTIMATORS, AdvantageEstimator, AdvantageInputs, Advantages


def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """[groups, samples] -> the same shape."""
    n = rewards.shape[-1]
    if n < 2:
        raise ValueError("rloo needs at least 2 samples per prompt")
    others_mean = (rewards.sum(dim=-1, keepdim=True) - rewards) / (n - 1)
    return rewards - others_mean


@ADVANTAGE_ESTIMATORS.register("rloo")
class RLOO(AdvantageEstimator):
    group_relative = True
    embodied = True
    def estimate(self, inputs: AdvantageInputs) -> Advantages:
        return Advantages(advantages=rloo_advantages(inputs.rewards).reshape(-1, 1) * inputs.response_mask)
