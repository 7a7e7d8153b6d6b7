"""SACLearner: one process's SAC update (no Ray): twin-Q critics with Polyak-averaged targets, the
squashed-Gaussian actor, automatic entropy tuning. The math is `algorithms/sac.py`; this composes it with
networks and three Adam optimizers (critics, actor, log alpha), as SB3's SAC does. The actor worker
(`workers/actor/sac.py`) and the single-process loop of the benchmark both drive it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_like.algorithms.sac import actor_loss, polyak_update, soft_q_target, temperature_loss, twin_q_min
from rlinf_like.config.validate import bounded
from rlinf_like.envs.base import ActionSpec
from rlinf_like.models.sac import SACRolloutPolicy, TwinQ


@dataclass(kw_only=True)
class SACConfig:
    tau: float = bounded(0.005, gt=0, le=1)  # sac: Polyak factor of the target critics per update
    batch_size: int = bounded(256, gt=0)  # sac: transitions per gradient step
    buffer_size: int = bounded(1_000_000, gt=0)  # sac: replay capacity (transitions; the oldest are overwritten)
    learning_starts: int = bounded(1000, ge=0)  # sac: env steps of uniform random actions before any update
    utd: float = bounded(1.0, gt=0)  # sac: gradient updates per env step (update-to-data ratio)
    n_step: int = bounded(1, ge=1)  # sac: n-step returns (1: the one-step soft Bellman target)
    init_alpha: float = bounded(1.0, gt=0)  # sac: the entropy temperature's initial value
    target_entropy: float | None = None  # sac: None: -(action dims), the SAC paper's heuristic


class SACLearner:
    def __init__(self, obs_dim: int, action: ActionSpec, hidden: list[int], cfg: SACConfig, gamma: float,
                 lr: float, adam_eps: float = 1e-8):
        self.cfg, self.gamma = cfg, gamma
        act_dim = len(action.low)
        self.policy = SACRolloutPolicy(obs_dim, action, hidden)
        self.q = TwinQ(obs_dim, act_dim, hidden)
        self.q_target = TwinQ(obs_dim, act_dim, hidden)
        self.q_target.load_state_dict(self.q.state_dict())
        self.q_target.requires_grad_(False)
        self.log_alpha = torch.tensor(float(cfg.init_alpha)).log().requires_grad_(True)
        self.target_entropy = -float(act_dim) if cfg.target_entropy is None else cfg.target_entropy
        adam = dict(lr=lr, eps=adam_eps, foreach=True)
        self.q_opt = torch.optim.Adam(self.q.parameters(), **adam)
        self.pi_opt = torch.optim.Adam(self.policy.actor.parameters(), **adam)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], **adam)
        self.updates = 0

    @property
    def actor(self):
        return self.policy.actor

    def update(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One gradient step on each of critics, actor, temperature; then the target critics' Polyak step.
        `batch`: obs, action, reward, discount (gamma^k x not terminated), next_obs."""
        obs, act, next_obs = batch["obs"], batch["action"], batch["next_obs"]
        # temperature first, from the current policy's log-probs (SB3's order)
        new_act, logp = self.actor(obs)
        alpha = self.log_alpha.detach().exp()  # this update uses alpha from before its own step (as SB3)
        alpha_loss = temperature_loss(self.log_alpha, logp, self.target_entropy)
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()
        with torch.no_grad():
            next_act, next_logp = self.actor(next_obs)
            next_q = self.q_target(next_obs, next_act)
            target = soft_q_target(batch["reward"], torch.zeros_like(batch["reward"]), batch["discount"],
                                   twin_q_min(next_q[0], next_q[1]), next_logp, alpha)
        q = self.q(obs, act)
        q_loss = 0.5 * ((q - target) ** 2).mean(1).sum()  # SB3: 0.5 * sum over critics of the MSE
        self.q_opt.zero_grad(set_to_none=True)
        q_loss.backward()
        self.q_opt.step()
        # the actor's loss through the critics just stepped; their grads are not kept
        self.q.requires_grad_(False)
        q_pi = self.q(obs, new_act)
        pi_loss = actor_loss(logp, twin_q_min(q_pi[0], q_pi[1]), alpha)
        self.pi_opt.zero_grad(set_to_none=True)
        pi_loss.backward()
        self.pi_opt.step()
        self.q.requires_grad_(True)
        polyak_update(list(self.q_target.parameters()), list(self.q.parameters()), self.cfg.tau)
        self.updates += 1
        return {"q_loss": float(q_loss.detach()), "actor_loss": float(pi_loss.detach()), "alpha": float(alpha),
                "alpha_loss": float(alpha_loss.detach()), "entropy": float(-logp.detach().mean()), "q_mean": float(q.detach().mean())}

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
