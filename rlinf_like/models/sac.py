"""SAC's networks for state observations and continuous actions: a tanh-squashed Gaussian actor and twin Q
critics (ReLU MLPs, as SB3's SAC).

`SACRolloutPolicy` is the actor in the rollout's call (`policy_base.py`): actions in [-1, 1] scaled to the
env's bounds by `env_actions`. Only the actor's parameters go through the weight sync.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlinf_like.envs.base import ActionSpec
from rlinf_like.models.policy_base import ActorCriticPolicy, PolicyOut

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # as SB3 and the SAC paper's code


def _relu_mlp(sizes: list[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers)


class SquashedGaussianActor(nn.Module):
    generator: torch.Generator | None = None  # what its sampling draws from (`use_generator`); None: torch's global

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int]):
        super().__init__()
        self.trunk = _relu_mlp([obs_dim, *hidden])
        self.mu = nn.Linear(hidden[-1], act_dim)
        self.log_std = nn.Linear(hidden[-1], act_dim)

    def forward(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """(action in [-1, 1], log pi(action | obs)) with the tanh change of variables."""
        h = self.trunk(obs)
        mu, log_std = self.mu(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)
        std = log_std.exp()
        u = mu if deterministic else mu + std * torch.randn(mu.shape, generator=self.generator)
        gauss = (-0.5 * ((u - mu) / std) ** 2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # log(1 - tanh(u)^2) in the stable form 2 (log 2 - u - softplus(-2u))
        squash = (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(-1)
        return torch.tanh(u), gauss - squash


class TwinQ(nn.Module):
    """`members` independent Q(obs, action) MLPs. (A batched ensemble, one `baddbmm` per layer for both
    critics, measured 1.7x slower than two `linear` calls per layer on CPU: plain modules it is.)"""

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int], members: int = 2):
        super().__init__()
        self.critics = nn.ModuleList(nn.Sequential(*_relu_mlp([obs_dim + act_dim, *hidden]),
                                                   nn.Linear(hidden[-1], 1)) for _ in range(members))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """[members, B]: every critic's Q(obs, action)."""
        x = torch.cat([obs, action], -1)
        return torch.stack([q(x).squeeze(-1) for q in self.critics])


class SACRolloutPolicy(ActorCriticPolicy):
    """The actor as the rollout calls a policy: (actions in [-1, 1], logprobs, 0, 0); no value head."""

    obs_modes = ("state",)
    obs_keys = ("state",)

    def __init__(self, obs_dim: int, action: ActionSpec, hidden: list[int]):
        super().__init__()
        if action.kind != "continuous":
            raise ValueError(f"SAC's actor takes continuous actions; the env's are {action.kind}")
        self.actor = SquashedGaussianActor(obs_dim, int(np.prod(action.shape)), hidden)
        self.register_buffer("low", torch.tensor(action.low, dtype=torch.float32), persistent=False)
        self.register_buffer("high", torch.tensor(action.high, dtype=torch.float32), persistent=False)
        self.random_actions = False  # the warm-up: uniform actions until algorithm.sac.learning_starts
        self.action_shape = (self.low.numel(),)  # a replay row's action

    def forward(self, obs: dict[str, torch.Tensor], actions: torch.Tensor | None = None,
                deterministic: bool = False) -> PolicyOut:
        x = obs["state"].float()
        if self.random_actions:
            a = torch.rand(x.shape[0], self.low.numel(), generator=self.generator) * 2 - 1
            logp = torch.zeros(x.shape[0])
        else:
            a, logp = self.actor(x, deterministic)
        zeros = torch.zeros(x.shape[0])
        return a, logp, zeros, zeros

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        return (self.low + (actions + 1.0) * 0.5 * (self.high - self.low)).numpy()
