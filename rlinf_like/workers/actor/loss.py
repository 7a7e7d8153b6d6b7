"""The actor's RL loss over a `build_rl_batch` batch: one function for GRPO, PPO and REINFORCE++.

Advantages arrive precomputed (the estimator is the runner's choice); this combines the clipped
policy loss, an optional KL-to-reference loss term, an entropy bonus and the off-policy terms
(`actor.loss.objective`, `actor.loss.is_correction`: algorithms/offpolicy.py). `LossConfig` is the config's
`actor.loss` section as the user wrote it; what the rest of the run decides (the KL weight, the sampling
temperature, whether to report the mismatch) is `LossTerms`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rlinf_like.algorithms import AGGREGATIONS, KL_ESTIMATORS, PolicyLossConfig, policy_loss
from rlinf_like.algorithms.offpolicy import ISThresholds, mismatch_metrics, policy_terms
from rlinf_like.algorithms.masked import masked_mean
from rlinf_like.config.validate import bounded
from rlinf_like.hybrid_engines import routing_replay
from rlinf_like.hybrid_engines.model_manager import token_stats


@dataclass(kw_only=True)
class LossConfig(PolicyLossConfig):
    """The PPO clip and aggregation (PolicyLossConfig, which the embodied PPO shares), and the actor's own terms."""
    # policy loss (algorithms/offpolicy.py POLICY_LOSSES): ppo (clip current / old; old = proximal when recomputed) |
    # decoupled_ppo (AReaL: clip current / proximal, weigh tokens by proximal / behaviour; needs
    # algorithm.recompute_logprobs)
    objective: str = "ppo"
    kl_estimator: str = "k3"  # k1 | k2 | k3 (algorithms/losses.py): in the loss, or the reward (algorithm.kl_in_reward)
    entropy_coef: float = 0.0  # entropy bonus weight in the loss
    # proximal / behaviour (trainer / rollout) correction, needs algorithm.recompute_logprobs (IS_CORRECTIONS): none |
    # tis (truncate at is_cap) | mis (drop tokens outside [is_low, is_high]) | icepop (zero them, still counted) |
    # seq_mask (drop responses whose geometric-mean ratio is outside [is_low, is_high])
    is_correction: str = "none"
    is_cap: float = bounded(ISThresholds.cap, gt=0)  # is_correction=tis: the weight ceiling
    is_low: float = bounded(ISThresholds.low, gt=0)  # is_correction=mis | icepop | seq_mask: lowest accepted ratio
    is_high: float = bounded(ISThresholds.high, gt=0)  # is_correction=mis | icepop | seq_mask: highest accepted ratio

    @property
    def thresholds(self) -> ISThresholds:
        return ISThresholds(cap=self.is_cap, low=self.is_low, high=self.is_high)


@dataclass(kw_only=True)
class LossTerms:
    """What the run decides about the loss beyond `actor.loss`."""
    kl_beta: float = 0.0  # weight of KL(pi || ref) as a loss term; needs "ref_logprobs" in the batch
    temperature: float = 1.0  # the rollout's sampling temperature: logprobs are taken under it
    # report mismatch/kl_k3 and mismatch/abs_log_ratio_mean of the loss's logprobs against the rollout's: the
    # train/rollout mismatch when every micro-batch runs before the step's one optimizer update
    report_mismatch: bool = False
    # mixture of experts, when the batch carries routes: "R3" runs the rollout's experts in the trainer's forward,
    # "R2" the ones the trainer's own recomputation of pi_old chose (hybrid_engines/routing_replay.py); "disabled"
    # lets the trainer's routers choose. Either way the loss reports moe/router_agreement (the trainer's routers
    # against the batch's routes) and moe/tokens_all_layers_equal
    routing_replay: str = "disabled"


# the keys a mean over micro-batches keeps meaning (a max or a percentile would not)
MEAN_MISMATCH = ("mismatch/kl_k3", "mismatch/abs_log_ratio_mean")


def rl_loss(config: LossConfig, run: LossTerms | None = None):
    """A `LossFn` for `ModelManager.forward_backward`."""
    run = run or LossTerms()

    def loss_fn(model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        if "routes" in batch:
            routing_replay.install(model, replay=run.routing_replay != "disabled")
        # entropy is always reported; it carries gradient only when it is weighted into the loss
        logprobs, entropy = token_stats(model, batch, run.temperature, entropy_grad=config.entropy_coef > 0)
        mask = batch["response_mask"]
        # behaviour = the rollout's logprobs, proximal = the trainer's recomputation (when there is one)
        terms = policy_terms(config.objective, config.is_correction, config.thresholds,
                             behaviour=batch["old_logprobs"], proximal=batch.get("recomputed_logprobs"), mask=mask)
        loss, metrics = policy_loss(logprobs, terms.old_logprobs, batch["advantages"], terms.mask, config,
                                    terms.weights)
        metrics["policy_loss"] = float(loss.detach())
        if "routes" in batch:
            metrics.update(routing_replay.agreement(model, batch))
        if run.kl_beta > 0:
            kl = KL_ESTIMATORS.get(config.kl_estimator)(logprobs, batch["ref_logprobs"])
            kl_term = AGGREGATIONS.get(config.aggregation)(kl, mask)
            loss = loss + run.kl_beta * kl_term
            metrics["kl"] = float(kl_term.detach())
        if run.report_mismatch:
            got = mismatch_metrics(logprobs, batch["old_logprobs"], mask)
            metrics.update({k: got[k] for k in MEAN_MISMATCH if k in got})
        mean_entropy = masked_mean(entropy, mask)
        metrics["entropy"] = float(mean_entropy.detach())
        if config.entropy_coef > 0:
            loss = loss - config.entropy_coef * mean_entropy
        return loss, metrics

    return loss_fn
