"""The advantage-estimator interface and its registry (pure tensors: no Ray, no config objects)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from rlinf_like.algorithms.registry import Registry


@dataclass(kw_only=True)
class AdvantageInputs:
    rewards: torch.Tensor  # [prompts, samples]: one outcome reward per response, a prompt's samples in a row
    response_mask: torch.Tensor  # [rows, tokens - 1]: 1 where a response token is predicted
    values: torch.Tensor | None = None  # [rows, tokens - 1]: the critic's values (estimators with needs_critic)
    kl_penalty: torch.Tensor | None = None  # [rows, tokens - 1]: beta x per-token KL, subtracted from token rewards


@dataclass(kw_only=True)
class Advantages:
    advantages: torch.Tensor  # [rows, tokens - 1], zero outside the response
    returns: torch.Tensor | None = None  # the critic's regression targets (estimators with needs_critic)
    metrics: dict[str, float] = field(default_factory=dict)


class AdvantageEstimator:
    """Subclasses set the declarations and implement `estimate`; options arrive as keyword arguments."""

    needs_critic: ClassVar[bool] = False  # the runner launches a critic and passes its values
    token_level: ClassVar[bool] = False  # per-token advantages (else one per response, broadcast over tokens)
    accepts_kl_in_reward: ClassVar[bool] = False  # takes a per-token KL penalty (algorithm.kl_in_reward)
    options: ClassVar[tuple[str, ...]] = ()  # the algorithm.* keys this estimator reads
    # works on embodied episodes: GAE over steps (`data/trajectory.py`), or one outcome per episode of a group
    # of `algorithm.group_size` episodes from the same initial state (`data/episode_groups.py`)
    embodied: ClassVar[bool] = False

    def __init__(self, **options: Any):
        unknown = set(options) - set(self.options)
        if unknown:
            raise TypeError(f"{type(self).__name__} takes options {list(self.options)}, got {sorted(unknown)}")
        self.__dict__.update(options)

    def estimate(self, inputs: AdvantageInputs) -> Advantages:
        raise NotImplementedError


ADVANTAGE_ESTIMATORS: Registry[type[AdvantageEstimator]] = Registry("advantage estimator")


def build_estimator(name: str, settings: Any) -> AdvantageEstimator:
    """The estimator `name`, given the options it declares, read from `settings` (the algorithm section)."""
    cls = ADVANTAGE_ESTIMATORS.get(name)
    return cls(**{key: getattr(settings, key) for key in cls.options})


def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor, kl_penalty: torch.Tensor | None) -> torch.Tensor:
    """Per-token rewards: each response's outcome reward on its last token, minus the KL penalty if any."""
    token_rewards = torch.zeros_like(mask)
    last = mask.shape[1] - 1 - mask.flip(1).argmax(1)
    token_rewards[torch.arange(mask.shape[0]), last] = rewards.reshape(-1)
    return token_rewards if kl_penalty is None else token_rewards - kl_penalty
