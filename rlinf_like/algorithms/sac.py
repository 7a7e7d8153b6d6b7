"""Soft actor-critic (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications") as pure tensor
functions: the twin-Q minimum, the soft Bellman target (n-step aware), the actor and temperature losses, the
Polyak update of target networks, and n-step return folding. No modules, no optimizers: the learners
(`workers/actor/sac_learner.py`, `discrete_sac_learner.py`) compose them; the tests check each against
hand-computed tensors.

The discrete variant (Christodoulou 2019, "Soft Actor-Critic for Discrete Action Settings") replaces the
sampled a' and the reparameterised actor by exact expectations over the categorical policy. Actions of
several tokens are factorised per token d (as the VLA's action head is): pi(a|s) = prod_d pi_d(a_d|s) and
Q(s, a) = mean_d Q_d(s, a_d) (the decoupled Q of Seyde et al. 2022, "Solving Continuous Control via
Q-learning"), so E_pi[Q] = mean_d E_pi_d[Q_d] and E_pi[log pi] = sum_d E_pi_d[log pi_d] stay exact. Tensors
are [B, D, A]: D tokens per action (1 for one categorical), A choices per token.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def twin_q_min(q1: torch.Tensor, q2: torch.Tensor) -> torch.Tensor:
    """Clipped double Q: the elementwise minimum of the two critics (counters Q over-estimation)."""
    return torch.minimum(q1, q2)


def bellman_target(rewards: torch.Tensor, terminated: torch.Tensor, discount: torch.Tensor | float,
                   next_value: torch.Tensor) -> torch.Tensor:
    """y = r + discount * (1 - terminated) * V(s'). `rewards` may be an n-step discounted sum with
    `discount` = gamma^k per row (k steps folded)."""
    return rewards + discount * (1.0 - terminated.float()) * next_value


def soft_q_target(rewards: torch.Tensor, terminated: torch.Tensor, discount: torch.Tensor | float,
                  next_q_min: torch.Tensor, next_logp: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """y = r + discount * (1 - terminated) * (min Q'(s', a') - alpha * log pi(a'|s')), a' ~ pi(s')."""
    return bellman_target(rewards, terminated, discount, next_q_min - alpha * next_logp)


def actor_loss(logp: torch.Tensor, q_min: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """E[alpha * log pi(a|s) - min Q(s, a)], a ~ pi(s) reparameterised."""
    return (alpha * logp - q_min).mean()


def temperature_loss(log_alpha: torch.Tensor, logp: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """Automatic entropy tuning: -E[log alpha * (log pi + target entropy)]; alpha grows while the policy's
    entropy (-log pi) is below the target. Gradients reach log alpha only."""
    return -(log_alpha * (logp.detach() + target_entropy)).mean()


# --- discrete actions: exact expectations over [B, D, A] categoricals ------------------------------------
def expected_logp(probs: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """[B]: E_pi[log pi(a|s)] = sum_d sum_a pi_d(a) log pi_d(a) (minus the joint entropy)."""
    return (probs * log_probs).sum((-2, -1))


def soft_value(probs: torch.Tensor, log_probs: torch.Tensor, q_min: torch.Tensor,
               alpha: torch.Tensor | float) -> torch.Tensor:
    """[B]: V(s) = E_pi[Q(s, a) - alpha log pi(a|s)] = mean_d sum_a pi_d Q_d - alpha sum_d sum_a pi_d log pi_d;
    for one token (D = 1) the paper's V(s) = sum_a pi(a|s) (min Q(s, a) - alpha log pi(a|s))."""
    return (probs * q_min).sum(-1).mean(-1) - alpha * expected_logp(probs, log_probs)


def discrete_actor_loss(probs: torch.Tensor, log_probs: torch.Tensor, q_min: torch.Tensor,
                        alpha: torch.Tensor | float) -> torch.Tensor:
    """E_s[E_pi[alpha log pi - Q]] = -E_s[V(s)] with Q held fixed: the gradient reaches the policy only."""
    return -soft_value(probs, log_probs, q_min.detach(), alpha).mean()


def factorised_q(q: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """q [..., B, D, A] and token ids [B, D] -> Q(s, a) = mean_d q_d(s, a_d), [..., B]."""
    index = actions.long().unsqueeze(-1).expand(*q.shape[:-1], 1)
    return q.gather(-1, index).squeeze(-1).mean(-1)


@torch.no_grad()
def polyak_update(target: Sequence[torch.Tensor], source: Sequence[torch.Tensor], tau: float) -> None:
    """target <- (1 - tau) * target + tau * source, in place, one fused call over all tensors."""
    torch._foreach_lerp_(list(target), list(source), tau)


def fold_n_step(rewards: np.ndarray, terminated: np.ndarray, gamma: float) -> tuple[float, bool, int]:
    """The first k <= n steps of a window, cut at the first terminal: (sum_i gamma^i r_i, terminated, k).
    The target then bootstraps from s_{t+k} with discount gamma^k (zero when terminated)."""
    total, k = 0.0, 0
    for k in range(len(rewards)):
        total += gamma ** k * float(rewards[k])
        if terminated[k]:
            return total, True, k + 1
    return total, False, len(rewards)
