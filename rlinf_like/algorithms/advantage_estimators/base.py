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
    logprobs: torch.Tensor | None = None  # [rows, tokens - 1]: the sampled tokens' logprobs under the rollout policy
    teacher_logprobs: torch.Tensor | None = None  # [rows, tokens - 1]: the teacher's (estimators with needs_teacher)


@dataclass(kw_only=True)
class Advantages:
    advantages: torch.Tensor  # [rows, tokens - 1], zero outside the response
    returns: torch.Tensor | None = None  # the critic's regression targets (estimators with needs_critic)
    metrics: dict[str, float] = field(default_factory=dict)


class AdvantageEstimator:
    """Subclasses set the declarations and implement `estimate`. An estimator with settings declares them as a
    dataclass, `Options`: the config section `algorithm.<name>` is that dataclass (each default stated there
    once), and the estimator reads it as `self.options`."""

    needs_critic: ClassVar[bool] = False  # the runner launches a critic and passes its values
    needs_teacher: ClassVar[bool] = False  # the runner launches teacher.model_path and passes its logprobs
    token_level: ClassVar[bool] = False  # per-token advantages (else one per response, broadcast over tokens)
    accepts_kl_in_reward: ClassVar[bool] = False  # takes a per-token KL penalty (algorithm.kl_in_reward)
    Options: ClassVar[type | None] = None  # the dataclass of its settings, the section algorithm.<name>
    # works on embodied episodes: GAE over steps (`data/trajectory.py`), or one outcome per episode of a group
    # of `algorithm.ppo.group_size` episodes from the same initial state (`data/episode_groups.py`)
    embodied: ClassVar[bool] = False

    def __init__(self, options: Any = None):
        if self.Options is None:
            if options is not None:
                raise TypeError(f"{type(self).__name__} declares no Options, got {options!r}")
        elif options is None:
            options = self.Options()
        elif not isinstance(options, self.Options):
            raise TypeError(f"{type(self).__name__} takes {self.Options.__name__}, got {type(options).__name__}")
        self.options = options

    # compares each response with the other samples of its prompt: with one sample a prompt, every advantage is 0
    group_relative: ClassVar[bool] = False

    def needs_group(self) -> bool:
        """Whether these options need >= 2 samples a prompt (`algorithm.samples_per_prompt`): the runner refuses 1."""
        return self.group_relative

    def estimate(self, inputs: AdvantageInputs) -> Advantages:
        raise NotImplementedError


ADVANTAGE_ESTIMATORS: Registry[type[AdvantageEstimator]] = Registry("advantage estimator")


def build_estimator(name: str, settings: Any) -> AdvantageEstimator:
    """The estimator `name` with its options: the section `settings.<name>` (an algorithm section holds one
    per estimator that declares `Options`)."""
    cls = ADVANTAGE_ESTIMATORS.get(name)
    return cls(None if cls.Options is None else getattr(settings, name))


def outcome_token_rewards(rewards: torch.Tensor, mask: torch.Tensor, kl_penalty: torch.Tensor | None) -> torch.Tensor:
    """Per-token rewards: each response's outcome reward on its last token, minus the KL penalty if any."""
    token_rewards = torch.zeros_like(mask)
    last = mask.shape[1] - 1 - mask.flip(1).argmax(1)
    token_rewards[torch.arange(mask.shape[0]), last] = rewards.reshape(-1)
    return token_rewards if kl_penalty is None else token_rewards - kl_penalty
