"""SACLearner: one process's SAC update (no Ray): twin-Q critics with Polyak-averaged targets, the
squashed-Gaussian actor, automatic entropy tuning. The math is `algorithms/sac.py`; this composes it with
networks and three Adam optimizers (critics, actor, log alpha), as SB3's SAC does. The actor worker
(`workers/actor/sac.py`) and the single-process loop of the benchmark both drive it.

`SoftLearner` is what it shares with the discrete variant (`discrete_sac_learner.py`): the temperature, the
optimizers and their steps, the Polyak step and the checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rlinf_like.algorithms.sac import actor_loss, polyak_update, soft_q_target, temperature_loss, twin_q_min
from rlinf_like.config.validate import bounded
from rlinf_like.envs.base import ActionSpec
from rlinf_like.models.sac import SACRolloutPolicy, TwinQ


@dataclass(kw_only=True)
class SACConfig:
    """The keys only embodied SAC (and discrete SAC) reads (`algorithm.sac`); the discount and the optimizer's are
    the algorithm's."""

    tau: float = bounded(0.005, gt=0, le=1)  # Polyak factor of the target critics per update
    batch_size: int = bounded(256, gt=0)  # transitions per gradient step
    buffer_size: int = bounded(1_000_000, gt=0)  # replay capacity (transitions; the oldest are overwritten)
    learning_starts: int = bounded(1000, ge=0)  # env steps of uniform random actions before any update
    utd: float = bounded(1.0, gt=0)  # gradient updates per env step (update-to-data ratio)
    n_step: int = bounded(1, ge=1)  # n-step returns (1: the one-step soft Bellman target)
    init_alpha: float = bounded(1.0, gt=0)  # the entropy temperature's initial value
    target_entropy: float | None = None  # None: -(action dims), the SAC paper's heuristic (discrete: below)
    # discrete_sac: with target_entropy None, the target is this fraction of the uniform policy's entropy log|A|
    # (|A| = choices ** tokens). Christodoulou 2019 uses 0.98; a lower one lets the policy commit sooner.
    target_entropy_ratio: float = bounded(0.5, gt=0, le=1)


class SoftLearner:
    """Critics `q` with targets `q_target`, the actor's parameters, log alpha, and one Adam each."""

    def __init__(self, policy: nn.Module, actor_params, q: nn.Module, q_target: nn.Module, target_entropy: float,
                 cfg: SACConfig, gamma: float, lr: float, adam_eps: float):
        self.cfg, self.gamma, self.target_entropy = cfg, gamma, target_entropy
        self.policy, self.q, self.q_target = policy, q, q_target
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.log_alpha = torch.tensor(float(cfg.init_alpha)).log().requires_grad_(True)
        adam = dict(lr=lr, eps=adam_eps, foreach=True)
        self.q_opt = torch.optim.Adam(self.q.parameters(), **adam)
        self.pi_opt = torch.optim.Adam(actor_params, **adam)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], **adam)
        self.updates = 0

    @staticmethod
    def _step(opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def _temperature(self, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step of log alpha from the current policy's log-probs (first, as SB3); returns (alpha, its loss):
        the alpha from before the step, which this whole update uses (as SB3)."""
        alpha = self.log_alpha.detach().exp()
        alpha_loss = temperature_loss(self.log_alpha, logp, self.target_entropy)
        self._step(self.alpha_opt, alpha_loss)
        return alpha, alpha_loss

    def _critic_step(self, q: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """q [members, B] towards the target; SB3's loss: 0.5 * sum over critics of the MSE."""
        q_loss = 0.5 * ((q - target) ** 2).mean(1).sum()
        self._step(self.q_opt, q_loss)
        return q_loss

    def _finish(self, **metrics: torch.Tensor | float) -> dict[str, float]:
        polyak_update(list(self.q_target.parameters()), list(self.q.parameters()), self.cfg.tau)
        self.updates += 1
        return {k: float(v.detach() if isinstance(v, torch.Tensor) else v) for k, v in metrics.items()}

    def state_dict(self) -> dict:
        return {"policy": self.policy.state_dict(), "q": self.q.state_dict(), "q_target": self.q_target.state_dict(),
                "log_alpha": self.log_alpha.detach().clone(), "q_opt": self.q_opt.state_dict(),
                "pi_opt": self.pi_opt.state_dict(), "alpha_opt": self.alpha_opt.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.q.load_state_dict(state["q"])
        self.q_target.load_state_dict(state["q_target"])
        with torch.no_grad():
            self.log_alpha.copy_(state["log_alpha"])
        self.q_opt.load_state_dict(state["q_opt"])
        self.pi_opt.load_state_dict(state["pi_opt"])
        self.alpha_opt.load_state_dict(state["alpha_opt"])
        self.updates = state["updates"]


def _state(obs: torch.Tensor | dict[str, torch.Tensor]) -> torch.Tensor:
    return obs["state"] if isinstance(obs, dict) else obs


class SACLearner(SoftLearner):
    def __init__(self, obs_dim: int, action: ActionSpec, hidden: list[int], cfg: SACConfig, gamma: float,
                 lr: float, adam_eps: float = 1e-8):
        act_dim = len(action.low)
        policy = SACRolloutPolicy(obs_dim, action, hidden)
        super().__init__(policy, policy.actor.parameters(), TwinQ(obs_dim, act_dim, hidden),
                         TwinQ(obs_dim, act_dim, hidden),
                         -float(act_dim) if cfg.target_entropy is None else cfg.target_entropy,
                         cfg, gamma, lr, adam_eps)

    @property
    def actor(self):
        return self.policy.actor

    def update(self, batch: dict) -> dict[str, float]:
        """One gradient step on each of critics, actor, temperature; then the target critics' Polyak step.
        `batch`: obs, action, reward, discount (gamma^k x not terminated), next_obs."""
        obs, act, next_obs = _state(batch["obs"]), batch["action"], _state(batch["next_obs"])
        new_act, logp = self.actor(obs)
        alpha, alpha_loss = self._temperature(logp)
        with torch.no_grad():
            next_act, next_logp = self.actor(next_obs)
            next_q = self.q_target(next_obs, next_act)
            target = soft_q_target(batch["reward"], torch.zeros_like(batch["reward"]), batch["discount"],
                                   twin_q_min(next_q[0], next_q[1]), next_logp, alpha)
        q = self.q(obs, act)
        q_loss = self._critic_step(q, target)
        # the actor's loss through the critics just stepped; their grads are not kept
        self.q.requires_grad_(False)
        q_pi = self.q(obs, new_act)
        pi_loss = actor_loss(logp, twin_q_min(q_pi[0], q_pi[1]), alpha)
        self._step(self.pi_opt, pi_loss)
        self.q.requires_grad_(True)
        return self._finish(q_loss=q_loss, actor_loss=pi_loss, alpha=alpha, alpha_loss=alpha_loss,
                            entropy=-logp.detach().mean(), q_mean=q.detach().mean())
