"""What the workers receive beyond the user's sections: the actor's training loop and the run's loss terms, and the
reward section with `reward.fn=auto` resolved. The one place where user keys are translated into worker configs
(`actor_setup.actor_config` assembles the actor's from these and the `actor.loss` section as written)."""

from __future__ import annotations

from dataclasses import replace

from rlinf_like.data.sources import default_reward
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.training.loop import LoopConfig
from rlinf_like.workers.actor.loss import LossTerms
from rlinf_like.workers.reward.fn import AUTO
from rlinf_like.workers.reward.rules import RewardConfig


def reward_config(cfg: ReasoningConfig) -> RewardConfig:
    """The `reward` section with reward.fn=auto replaced by the data source's reward function."""
    return replace(cfg.reward, fn=default_reward(cfg.data)) if cfg.reward.fn == AUTO else cfg.reward


def runner_loop(cfg: ReasoningConfig, micro_batch_tokens: int | None = None) -> LoopConfig:
    """The actor's and critic's training loop from the runner and algorithm sections; `micro_batch_tokens`: the
    memory budget's tokens, which size micro-batches when runner.micro_batch_size is null (runners/reasoning/memory.py)."""
    r, a = cfg.runner, cfg.algorithm
    return LoopConfig(mini_batches=a.mini_batches, micro_batch_size=r.micro_batch_size, epochs=a.epochs,
                      micro_batch_tokens=micro_batch_tokens,
                      seed=r.seed, pack_sequences=r.pack_sequences, max_batch_seqlen=r.max_batch_seqlen,
                      max_tokens_per_micro_batch=r.max_tokens_per_micro_batch)


def loss_terms(cfg: ReasoningConfig) -> LossTerms:
    """What the run decides about the actor's loss beyond `actor.loss`: the KL weight (0 when the KL goes into the
    reward instead), the sampling temperature, and whether the loss's logprobs measure the train/rollout mismatch."""
    a = cfg.algorithm
    # without a recomputation, the loss's own logprobs before the step's only update are the trainer's: the
    # train/rollout mismatch costs nothing to report then
    single_update = a.mini_batches == 1 and a.epochs == 1
    return LossTerms(kl_beta=0.0 if a.kl_in_reward else a.kl_beta, temperature=cfg.runner.temperature,
                     report_mismatch=single_update and not a.recompute_logprobs)
