"""RL algorithms as pure tensor functions (no Ray, no processes): advantages, policy / value losses,
KL estimators, aggregation. Registries map config names to functions."""

from rlinf_like.algorithms.advantage_estimators import ADVANTAGE_ESTIMATORS, AdvantageInputs, Advantages, build_estimator
from rlinf_like.algorithms.advantage_estimators.gae import gae
from rlinf_like.algorithms.advantage_estimators.grpo import grpo_advantages
from rlinf_like.algorithms.advantage_estimators.reinforce_pp import reinforce_pp_advantages
from rlinf_like.algorithms.advantage_estimators.rloo import rloo_advantages
from rlinf_like.algorithms.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    PolicyLossConfig,
    entropy_from_logits,
    policy_loss,
    value_loss,
)
from rlinf_like.algorithms.offpolicy import IS_CORRECTIONS, POLICY_LOSSES, ISThresholds, mismatch_metrics, policy_terms
from rlinf_like.algorithms.masked import masked_mean, masked_sum, masked_whiten

__all__ = [
    "ADVANTAGE_ESTIMATORS", "AGGREGATIONS", "AdvantageInputs", "Advantages", "KL_ESTIMATORS", "PolicyLossConfig", "build_estimator", "entropy_from_logits", "gae",
    "grpo_advantages", "masked_mean", "masked_sum", "masked_whiten", "policy_loss", "reinforce_pp_advantages",
    "rloo_advantages", "IS_CORRECTIONS", "POLICY_LOSSES", "ISThresholds", "mismatch_metrics", "policy_terms", "value_loss",
]
