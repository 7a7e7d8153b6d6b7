"""RL algorithms as pure tensor functions (no Ray, no processes): advantages, policy / value losses,
KL estimators, aggregation. Registries map config names to functions."""

from rlinf_like.algorithms.advantages import OUTCOME_ADVANTAGES, gae, grpo_advantages, reinforce_pp_advantages, rloo_advantages
from rlinf_like.algorithms.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    PolicyLossConfig,
    entropy_from_logits,
    policy_loss,
    truncated_is_weights,
    value_loss,
)
from rlinf_like.algorithms.masked import masked_mean, masked_sum, masked_whiten

__all__ = [
    "AGGREGATIONS", "KL_ESTIMATORS", "OUTCOME_ADVANTAGES", "PolicyLossConfig", "entropy_from_logits", "gae",
    "grpo_advantages", "masked_mean", "masked_sum", "masked_whiten", "policy_loss", "reinforce_pp_advantages",
    "rloo_advantages", "truncated_is_weights", "value_loss",
]
