"""What the workers receive beyond the user's sections: what the run decides about the actor's loop and loss, and
the reward section with `reward.fn=auto` resolved. The one place where user keys are translated into worker configs
(`actor_setup.actor_config` assembles the actor's from these and the `actor.loss` section as written)."""

from __future__ import annotations

from dataclasses import replace

from rlinf_like.data.sources import default_reward
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.training.loop import LoopTerms
from rlinf_like.workers.actor.loss import LossTerms
from rlinf_like.workers.reward.fn import AUTO
from rlinf_like.workers.reward.rules import RewardConfig


def reward_config(cfg: ReasoningConfig) -> RewardConfig:
    """The `reward` section with reward.fn=auto replaced by the data source's reward function."""
    return replace(cfg.reward, fn=default_reward(cfg.data)) if cfg.reward.fn == AUTO else cfg.reward


def loop_terms(cfg: ReasoningConfig, micro_batch_tokens: int | None = None) -> LoopTerms:
    """What the run decides about the actor's and critic's loop beyond `actor.loop`: the shuffle's seed, and
    `micro_batch_tokens`, the memory budget's tokens, which size micro-batches when actor.loop.micro_batch_size is
    null (runners/reasoning/memory.py)."""
    return LoopTerms(seed=cfg.runner.seed, micro_batch_tokens=micro_batch_tokens)


def loss_terms(cfg: ReasoningConfig) -> LossTerms:
    """What the run decides about the actor's loss beyond `actor.loss`: the KL weight (0 when the KL goes into the
    reward instead), the sampling temperature, and whether the loss's logprobs measure the train/rollout mismatch."""
    a, loop = cfg.algorithm, cfg.actor.loop
    # without a recomputation, the loss's own logprobs before the step's only update are the trainer's: the
    # train/rollout mismatch costs nothing to report then
    single_update = loop.mini_batches == 1 and loop.epochs == 1
    return LossTerms(kl_beta=0.0 if a.kl_in_reward else a.kl_beta, temperature=cfg.runner.temperature,
                     report_mismatch=single_update and not a.recompute_logprobs,
                     routing_replay=cfg.actor.routing_replay)
