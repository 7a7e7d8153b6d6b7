"""GRPO: each response's reward against its group's mean, over the group's std (Dr. GRPO without)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_like.algorithms.advantage_estimators.base import ADVANTAGE_ESTIMATORS, AdvantageEstimator, AdvantageInputs, Advantages


def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6, scale_by_std: bool = True) -> torch.Tensor:
    """[groups, samples] -> the same shape. A group of equal rewards gets 0."""
    centered = rewards - rewards.mean(dim=-1, keepdim=True)
    if not scale_by_std:
        return centered
    if rewards.shape[-1] < 2:
        return torch.zeros_like(rewards)
    return centered / (rewards.std(dim=-1, keepdim=True) + eps)


@dataclass(kw_only=True)
class GRPOOptions:
    scale_by_std: bool = True  # divide by the group's reward std; false = Dr. GRPO


@ADVANTAGE_ESTIMATORS.register("grpo")
class GRPO(AdvantageEstimator):
    group_relative = True
    embodied = True
    Options = GRPOOptions

    def estimate(self, inputs: AdvantageInputs) -> Advantages:
        per_response = grpo_advantages(inputs.rewards, scale_by_std=self.options.scale_by_std)
        return Advantages(advantages=per_response.reshape(-1, 1) * inputs.response_mask)
