"""How rule-based rewards and a learned reward model's scores make one reward per response:
`reward.kind` picks rule, model or both (a weighted sum), the model score goes through the penalty
rules, and the result is optionally whitened over the batch. Pure functions; the RewardWorker
calls them."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlinf_like.utils.registry import Registry
from rlinf_like.workers.reward.fn import load_reward_fn
from rlinf_like.workers.reward.penalties import apply_penalty, penalty_mask, whiten
from rlinf_like.workers.reward.rules import RewardConfig


@dataclass(frozen=True)
class RewardKind:
    """What `reward.kind` declares: whether it needs the reward model, which weights it reads (all of them 0 would
    give no reward), and how the rule rewards and the penalised model scores make the total."""

    uses_model: bool
    weights: tuple[str, ...]
    total: Callable[[RewardConfig, torch.Tensor, torch.Tensor | None], torch.Tensor]


REWARD_KINDS: Registry[RewardKind] = Registry("reward kind", key="reward.kind")
REWARD_KINDS.register("rule", RewardKind(uses_model=False, weights=(), total=lambda c, rule, model: rule.float()))
REWARD_KINDS.register("model", RewardKind(uses_model=True, weights=("model_weight",),
                                          total=lambda c, rule, model: c.model_weight * model))
REWARD_KINDS.register("both", RewardKind(
    uses_model=True, weights=("rule_weight", "model_weight"),
    total=lambda c, rule, model: c.rule_weight * rule.float() + c.model_weight * model))


def check_reward_config(config: RewardConfig) -> None:
    """Raises naming the `reward.*` key and the allowed values. Loads `reward.fn` (a user's module is
    imported here too, so a typo fails before any worker starts)."""
    kind = REWARD_KINDS.get(config.kind)
    load_reward_fn(config)
    if not config.timeout_s > 0:
        raise ValueError(f"reward.timeout_s must be > 0, got {config.timeout_s}")
    for key in ("rule_weight", "model_weight", "model_penalty", "error_value"):
        if not math.isfinite(getattr(config, key)):
            raise ValueError(f"reward.{key} must be finite, got {getattr(config, key)}")
    if kind.uses_model and not config.model_path:
        raise ValueError(f"reward.kind={config.kind!r} needs reward.model_path (a *ForSequenceClassification "
                         f"checkpoint with num_labels=1)")
    if kind.weights and all(getattr(config, w) == 0 for w in kind.weights):
        raise ValueError(f"reward.kind={config.kind!r} with " + " and ".join(f"reward.{w}=0" for w in kind.weights)
                         + " gives no reward")
    if config.model_micro_batch_size is not None and config.model_micro_batch_size <= 0:
        raise ValueError(f"reward.model_micro_batch_size must be > 0 or null (all rows in one pass), got "
                         f"{config.model_micro_batch_size}")
    if config.model_min_response_tokens < 0:
        raise ValueError(f"reward.model_min_response_tokens must be >= 0, got {config.model_min_response_tokens}")


def combine_rewards(config: RewardConfig, rule: torch.Tensor, model_scores: torch.Tensor | None,
                    finished: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[N] rewards, and the penalised model scores (None for kind=rule)."""
    kind, penalised = REWARD_KINDS.get(config.kind), None
    if kind.uses_model:
        if model_scores is None:
            raise ValueError(f"reward.kind={config.kind!r} needs model scores")
        mask = penalty_mask(finished, lengths, config.model_penalise_no_eos, config.model_min_response_tokens)
        penalised = apply_penalty(model_scores.float(), mask, config.model_penalty)
    total = kind.total(config, rule, penalised)
    if config.whiten and total.numel() > 1:
        total = whiten(total, shift_mean=config.whiten_shift_mean)
    return total, penalised
