"""Soft actor-critic (Haarnoja et al. 2018, "Soft Actor-Critic Algorithms and Applications") as pure tensor
functions: the twin-Q minimum, the soft Bellman target (n-step aware), the actor and temperature losses, the
Polyak update of target networks, and n-step return folding. No modules, no optimizers: the learner
(`workers/actor/sac.py`) composes them; the tests check each against hand-computed tensors.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def twin_q_min(q1: torch.Tensor, q2: torch.Tensor) -> torch.Tensor:
    """Clipped double Q: the elementwise minimum of the two critics (counters Q over-estimation)."""
    return torch.minimum(q1, q2)


def soft_q_target(rewards: torch.Tensor, terminated: torch.Tensor, discount: torch.Tensor | float,
                  next_q_min: torch.Tensor, next_logp: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """y = r + discount * (1 - terminated) * (min Q'(s', a') - alpha * log pi(a'|s')), a' ~ pi(s').
    `rewards` may be an n-step discounted sum with `discount` = gamma^k per row (k steps folded)."""
    soft_value = next_q_min - alpha * next_logp
    return rewards + discount * (1.0 - terminated.float()) * soft_value


def actor_loss(logp: torch.Tensor, q_min: torch.Tensor, alpha: torch.Tensor | float) -> torch.Tensor:
    """E[alpha * log pi(a|s) - min Q(s, a)], a ~ pi(s) reparameterised."""
    return (alpha * logp - q_min).mean()


def temperature_loss(log_alpha: torch.Tensor, logp: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """Automatic entropy tuning: -E[log alpha * (log pi + target entropy)]; alpha grows while the policy's
    entropy (-log pi) is below the target. Gradients reach log alpha only."""
    return -(log_alpha * (logp.detach() + target_entropy)).mean()


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
