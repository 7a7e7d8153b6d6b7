"""The actor's RL loss over a `build_rl_batch` batch: one function for GRPO, PPO and REINFORCE++.

Advantages arrive precomputed (the estimator is the runner's choice); this combines the clipped
policy loss, an optional KL-to-reference loss term, an entropy bonus and the off-policy terms
(`algorithm.loss`, `algorithm.is_correction`: algorithms/offpolicy.py), all from the config.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from rlinf_like.algorithms import AGGREGATIONS, KL_ESTIMATORS, PolicyLossConfig, policy_loss
from rlinf_like.algorithms.offpolicy import ISThresholds, mismatch_metrics, policy_terms
from rlinf_like.algorithms.masked import masked_mean
from rlinf_like.hybrid_engines.model_manager import token_stats


@dataclass(kw_only=True)
class LossConfig:
    policy: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    kl_beta: float = 0.0  # weight of KL(pi || ref) as a loss term; needs "ref_logprobs" in the batch
    kl_estimator: str = "k3"
    entropy_coef: float = 0.0
    objective: str = "ppo"  # a name in POLICY_LOSSES (algorithms/offpolicy.py): which logprobs the ratio reads
    is_correction: str = "none"  # a name in IS_CORRECTIONS: proximal / behaviour weights and loss mask
    is_thresholds: ISThresholds = field(default_factory=ISThresholds)
    temperature: float = 1.0  # the rollout's sampling temperature: logprobs are taken under it
    # report mismatch/kl_k3 and mismatch/abs_log_ratio_mean of the loss's logprobs against the rollout's: the
    # train/rollout mismatch when every micro-batch runs before the step's one optimizer update
    report_mismatch: bool = False


# the keys a mean over micro-batches keeps meaning (a max or a percentile would not)
MEAN_MISMATCH = ("mismatch/kl_k3", "mismatch/abs_log_ratio_mean")


def rl_loss(config: LossConfig):
    """A `LossFn` for `ModelManager.forward_backward`."""

    def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        # entropy is always reported; it carries gradient only when it is weighted into the loss
        logprobs, entropy = token_stats(model, batch, config.temperature, entropy_grad=config.entropy_coef > 0)
        mask = batch["response_mask"]
        # behaviour = the rollout's logprobs, proximal = the trainer's recomputation (when there is one)
        terms = policy_terms(config.objective, config.is_correction, config.is_thresholds,
                             behaviour=batch["old_logprobs"], proximal=batch.get("recomputed_logprobs"), mask=mask)
        loss, metrics = policy_loss(logprobs, terms.old_logprobs, batch["advantages"], terms.mask, config.policy,
                                    terms.weights)
        metrics["policy_loss"] = float(loss.detach())
        if config.kl_beta > 0:
            kl = KL_ESTIMATORS.get(config.kl_estimator)(logprobs, batch["ref_logprobs"])
            kl_term = AGGREGATIONS.get(config.policy.aggregation)(kl, mask)
            loss = loss + config.kl_beta * kl_term
            metrics["kl"] = float(kl_term.detach())
        if config.report_mismatch:
            got = mismatch_metrics(logprobs, batch["old_logprobs"], mask)
            metrics.update({k: got[k] for k in MEAN_MISMATCH if k in got})
        mean_entropy = masked_mean(entropy, mask)
        metrics["entropy"] = float(mean_entropy.detach())
        if config.entropy_coef > 0:
            loss = loss - config.entropy_coef * mean_entropy
        return loss, metrics

    return loss_fn
