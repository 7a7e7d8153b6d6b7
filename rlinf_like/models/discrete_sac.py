"""Discrete SAC's networks, built from the registered policies (`policy.kind`) that act in tokens
(`action_logits`): the MLP on a discrete action space, the pixel VLA (its action tokens).

`TokenPolicy` is the actor as the rollout calls it (sampled token ids [B, D], their log-prob, 0, 0);
`TokenQ` is the twin critic: two more copies of the same policy network, whose action-token logits are read
as Q(s, a_d) for every token d and choice a_d, so a critic sees what the actor sees (pixels and
instruction for the VLA) with no separate encoder to write. Only the actor goes through the weight sync.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from rlinf_like.envs.base import ActionSpec, FieldSpec
from rlinf_like.models.policies import ActorCriticPolicy, PolicyConfig, PolicyOut, build_policy, policy_class
from rlinf_like.models.policy_base import sample


def _probe(obs_spec: dict[str, FieldSpec], keys: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """One all-zeros observation (to read the logits' shape)."""
    return {k: torch.from_numpy(np.zeros((1, *obs_spec[k].shape), obs_spec[k].dtype)) for k in keys if k in obs_spec}


def token_network(cfg: PolicyConfig, obs_spec: dict[str, FieldSpec], action: ActionSpec,
                  init: bool = True) -> ActorCriticPolicy:
    """The registered policy, refused by key unless it acts in discrete tokens for this action space."""
    kind = policy_class(cfg.kind).action_kind(action)
    if kind != "discrete":
        raise ValueError(f"algorithm.name=discrete_sac: policy.kind={cfg.kind} acts in {kind} actions on this env "
                         f"(its actions are {action.kind}); use algorithm.name=sac, or policy.kind=vla (action tokens)")
    if init:
        return build_policy(cfg, obs_spec, action)
    return policy_class(cfg.kind).from_config(cfg, obs_spec, action)  # a critic: never policy.init_weights


class TokenPolicy(nn.Module):
    """Categoricals over `choices` per token, `dims` tokens per action (flattened from the policy's token shape);
    uniform random tokens while `random_actions` (the warm-up before algorithm.sac.learning_starts)."""

    generator: torch.Generator | None = None  # what its sampling draws from (`use_generator`); None: torch's global

    def __init__(self, cfg: PolicyConfig, obs_spec: dict[str, FieldSpec], action: ActionSpec):
        super().__init__()
        self.net = token_network(cfg, obs_spec, action)
        self.obs_keys = self.net.obs_keys
        with torch.no_grad():
            shape = self.net.action_logits(_probe(obs_spec, self.obs_keys)).shape
        self.token_shape, self.choices = tuple(shape[1:-1]), int(shape[-1])
        self.dims = int(np.prod(self.token_shape))
        self.action_shape = (self.dims,)  # a replay row's action: the token ids
        self.random_actions = False

    def logits(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, D, A]."""
        logits = self.net.action_logits(obs)
        return logits.reshape(logits.shape[0], self.dims, self.choices)

    def forward(self, obs: dict[str, torch.Tensor], deterministic: bool = False) -> PolicyOut:
        rows = next(iter(obs.values())).shape[0]
        zeros = torch.zeros(rows)
        if self.random_actions:
            return torch.randint(self.choices, (rows, self.dims), generator=self.generator), zeros, zeros, zeros
        logits = self.logits(obs)
        dist = Categorical(logits=logits)
        tokens = logits.argmax(-1) if deterministic else sample(dist, self.generator)
        return tokens, dist.log_prob(tokens).sum(-1), zeros, zeros

    def env_actions(self, tokens: torch.Tensor) -> np.ndarray:
        return self.net.env_actions(tokens.long().reshape(-1, *self.token_shape))


class TokenQ(nn.Module):
    """`members` critics, each a fresh copy of the policy network: forward -> [members, B, D, A] Q values."""

    def __init__(self, cfg: PolicyConfig, obs_spec: dict[str, FieldSpec], action: ActionSpec, dims: int,
                 choices: int, members: int = 2):
        super().__init__()
        self.critics = nn.ModuleList(token_network(cfg, obs_spec, action, init=False) for _ in range(members))
        self.dims, self.choices = dims, choices

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.stack([q.action_logits(obs).reshape(-1, self.dims, self.choices) for q in self.critics])
