"""What the workers receive, built from the user's sections: the actor's loss and training loop, the importance
correction's thresholds, and the reward section with `reward.fn=auto` resolved. The one place where user keys are
translated into worker configs (`actor_setup.actor_config` assembles the actor's from these)."""

from __future__ import annotations

from dataclasses import replace

from rlinf_like.algorithms.losses import PolicyLossConfig
from rlinf_like.algorithms.offpolicy import ISThresholds
from rlinf_like.data.sources import default_reward
from rlinf_like.runners.reasoning.config import AlgorithmConfig, ReasoningConfig
from rlinf_like.training.loop import LoopConfig
from rlinf_like.workers.actor.loss import LossConfig
from rlinf_like.workers.reward.fn import AUTO
from rlinf_like.workers.reward.rules import RewardConfig


def reward_config(cfg: ReasoningConfig) -> RewardConfig:
    """The `reward` section with reward.fn=auto replaced by the data source's reward function."""
    return replace(cfg.reward, fn=default_reward(cfg.data)) if cfg.reward.fn == AUTO else cfg.reward


def is_thresholds(a: AlgorithmConfig) -> ISThresholds:
    """The `algorithm.is_*` keys as the corrections read them."""
    return ISThresholds(cap=a.is_cap, low=a.is_low, high=a.is_high)


def runner_loop(cfg: ReasoningConfig, micro_batch_tokens: int | None = None) -> LoopConfig:
    """The actor's and critic's training loop from the runner and algorithm sections; `micro_batch_tokens`: the
    memory budget's tokens, which size micro-batches when runner.micro_batch_size is null (runners/reasoning/memory.py)."""
    r, a = cfg.runner, cfg.algorithm
    return LoopConfig(mini_batches=a.mini_batches, micro_batch_size=r.micro_batch_size, epochs=a.epochs,
                      micro_batch_tokens=micro_batch_tokens,
                      seed=r.seed, pack_sequences=r.pack_sequences, max_batch_seqlen=r.max_batch_seqlen,
                      max_tokens_per_micro_batch=r.max_tokens_per_micro_batch)


def loss_config(cfg: ReasoningConfig) -> LossConfig:
    a = cfg.algorithm
    loss_kl = 0.0 if a.kl_in_reward else a.kl_beta  # the KL goes into the reward or the loss, not both
    policy = PolicyLossConfig(clip_low=a.clip_low, clip_high=a.clip_high, dual_clip=a.dual_clip,
                              aggregation=a.aggregation)
    # without a recomputation, the loss's own logprobs before the step's only update are the trainer's: the
    # train/rollout mismatch costs nothing to report then
    single_update = a.mini_batches == 1 and a.epochs == 1
    return LossConfig(policy=policy, kl_beta=loss_kl, kl_estimator=a.kl_estimator, entropy_coef=a.entropy_coef,
                      objective=a.loss, is_correction=a.is_correction, is_thresholds=is_thresholds(a),
                      temperature=cfg.runner.temperature, report_mismatch=single_update and not a.recompute_logprobs)
