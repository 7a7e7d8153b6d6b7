"""DiscreteSACLearner: SAC for policies that act in tokens (Christodoulou 2019), one process, no Ray. The actor
is a registered policy (`TokenPolicy`: the MLP on a discrete action space, the pixel VLA), the twin critics
two more copies of its network reading Q for every token and choice (`TokenQ`). The soft value, the actor
loss and the temperature loss are exact expectations over the categoricals (`algorithms/sac.py`), so there
is no reparameterisation and no sampled a'. The optimizers, temperature step, Polyak step and checkpoint are
`SoftLearner`'s, shared with the continuous SAC.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rlinf_like.algorithms.sac import (bellman_target, discrete_actor_loss, expected_logp, factorised_q, soft_value,
                                       twin_q_min)
from rlinf_like.envs.base import ActionSpec, FieldSpec
from rlinf_like.models.discrete_sac import TokenPolicy, TokenQ
from rlinf_like.models.policy_base import PolicyConfig
from rlinf_like.workers.actor.sac_learner import SACConfig, SoftLearner


def target_entropy(cfg: SACConfig, dims: int, choices: int) -> float:
    """algorithm.sac.target_entropy, or algorithm.sac.target_entropy_ratio x log|A| with |A| = choices ** dims."""
    return cfg.target_entropy if cfg.target_entropy is not None else cfg.target_entropy_ratio * dims * math.log(choices)


class DiscreteSACLearner(SoftLearner):
    def __init__(self, policy_cfg: PolicyConfig, obs_spec: dict[str, FieldSpec], action: ActionSpec, cfg: SACConfig,
                 gamma: float, lr: float, adam_eps: float = 1e-8):
        policy = TokenPolicy(policy_cfg, obs_spec, action)
        dims, choices = policy.dims, policy.choices
        super().__init__(policy, policy.parameters(), TokenQ(policy_cfg, obs_spec, action, dims, choices),
                         TokenQ(policy_cfg, obs_spec, action, dims, choices), target_entropy(cfg, dims, choices),
                         cfg, gamma, lr, adam_eps)

    def update(self, batch: dict) -> dict[str, float]:
        """One step each of temperature, critics, actor (SB3's order, as the continuous learner), then Polyak.
        `batch`: obs and next_obs (dicts of the policy's fields), action (token ids [B, D]), reward, discount."""
        obs, next_obs = batch["obs"], batch["next_obs"]
        log_probs = F.log_softmax(self.policy.logits(obs), -1)  # [B, D, A]
        probs = log_probs.exp()
        alpha, alpha_loss = self._temperature(expected_logp(probs, log_probs))
        with torch.no_grad():
            next_log_probs = F.log_softmax(self.policy.logits(next_obs), -1)
            next_q = self.q_target(next_obs)
            next_v = soft_value(next_log_probs.exp(), next_log_probs, twin_q_min(next_q[0], next_q[1]), alpha)
            target = bellman_target(batch["reward"], torch.zeros_like(batch["reward"]), batch["discount"], next_v)
        q_all = self.q(obs)  # [members, B, D, A]
        q = factorised_q(q_all, batch["action"])
        q_loss = self._critic_step(q, target)
        with torch.no_grad():  # the actor's loss reads the critics just stepped, as constants
            q_pi = self.q(obs)
        pi_loss = discrete_actor_loss(probs, log_probs, twin_q_min(q_pi[0], q_pi[1]), alpha)
        self._step(self.pi_opt, pi_loss)
        return self._finish(q_loss=q_loss, actor_loss=pi_loss, alpha=alpha, alpha_loss=alpha_loss,
                            entropy=-expected_logp(probs, log_probs).detach().mean(), q_mean=q.detach().mean())
