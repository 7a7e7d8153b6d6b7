"""The embodied policy registry (`policy.kind`), and the state-observation MLP actor-critic.

Policies share one call (see `policy_base.py`) and declare the observations they read, so the
runner can refuse an env / policy pair that does not fit before any worker starts. To add a
policy, subclass `ActorCriticPolicy`, declare `obs_modes` / `obs_keys`, implement `from_config`,
and register it here by import path (or `@POLICY_REGISTRY.register("name")` on the class).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal

from rlinf_like.envs.base import ActionSpec, FieldSpec
from rlinf_like.models.policy_base import ActorCriticPolicy, PolicyConfig, PolicyOut, sample
from rlinf_like.utils.registry import Registry

POLICY_REGISTRY: Registry[type[ActorCriticPolicy]] = Registry("policy", key="policy.kind")
POLICY_REGISTRY.register("vla", "rlinf_like.models.vla:VLAPolicy")

__all__ = ["POLICY_REGISTRY", "ActorCriticPolicy", "MLPActorCritic", "PolicyConfig", "PolicyOut", "build_policy",
           "check_policy_fits", "policy_class"]


def _mlp(sizes: list[int], out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        linear = nn.Linear(a, b)
        last = i == len(sizes) - 2
        nn.init.orthogonal_(linear.weight, out_gain if last else math.sqrt(2))  # SB3's PPO init
        nn.init.zeros_(linear.bias)
        layers += [linear] if last else [linear, nn.Tanh()]
    return nn.Sequential(*layers)


@POLICY_REGISTRY.register("mlp")
class MLPActorCritic(ActorCriticPolicy):
    """Separate tanh MLPs for policy and value (as SB3's MlpPolicy): a Gaussian with a learned,
    state-independent log std for continuous actions, a categorical for discrete ones."""

    obs_modes = ("state",)
    obs_keys = ("state",)

    @classmethod
    def from_config(cls, cfg: PolicyConfig, obs_spec: dict[str, FieldSpec], action: ActionSpec) -> MLPActorCritic:
        if set(obs_spec) != {"state"}:
            raise ValueError(f"policy.kind=mlp takes state observations; the env gives {sorted(obs_spec)} "
                             "(use policy.kind=vla for pixels)")
        return cls(int(np.prod(obs_spec["state"].shape)), action, list(cfg.hidden), cfg.log_std_init)

    def __init__(self, obs_dim: int, action: ActionSpec, hidden: list[int], log_std_init: float = 0.0):
        super().__init__()
        self.action = action
        self.continuous = action.kind == "continuous"
        out = int(np.prod(action.shape)) if self.continuous else action.n
        self.pi = _mlp([obs_dim, *hidden, out], 0.01)
        self.vf = _mlp([obs_dim, *hidden, 1], 1.0)
        if self.continuous:
            self.log_std = nn.Parameter(torch.full((out,), float(log_std_init)))

    def forward(self, obs: dict[str, torch.Tensor], actions: torch.Tensor | None = None,
                deterministic: bool = False) -> PolicyOut:
        x = obs["state"].float()
        head, values = self.pi(x), self.vf(x).squeeze(-1).clone()  # FSDP2 warns on view outputs
        if self.continuous:
            dist = Normal(head, self.log_std.exp().expand_as(head))
            if actions is None:
                actions = head if deterministic else sample(dist, self.generator)
            return actions, dist.log_prob(actions).sum(-1), dist.entropy().sum(-1), values
        dist = Categorical(logits=head)
        if actions is None:
            actions = head.argmax(-1) if deterministic else sample(dist, self.generator)
        return actions, dist.log_prob(actions), dist.entropy(), values

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        return actions.detach().cpu().numpy()

    def action_logits(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.continuous:
            return super().action_logits(obs)
        return self.pi(obs["state"].float())  # [B, n]: one token of n choices


def policy_class(kind: str) -> type[ActorCriticPolicy]:
    """The policy class `policy.kind=kind` picks; an unknown kind raises naming the key and the choices."""
    return POLICY_REGISTRY.get(kind)


def check_policy_fits(kind: str, obs_mode: str) -> type[ActorCriticPolicy]:
    """Refuse, by key, a policy that cannot read the env's observations (before any worker starts)."""
    policy = policy_class(kind)
    if obs_mode not in policy.obs_modes:
        readers = [name for name in POLICY_REGISTRY.names() if obs_mode in policy_class(name).obs_modes]
        raise ValueError(f"policy.kind={kind!r} reads env.obs_mode in {list(policy.obs_modes)}, not {obs_mode!r}; "
                         f"policies that read {obs_mode!r}: {readers}")
    return policy


def build_policy(cfg: PolicyConfig, obs_spec: dict[str, FieldSpec], action: ActionSpec) -> ActorCriticPolicy:
    policy = policy_class(cfg.kind).from_config(cfg, obs_spec, action)
    if cfg.init_weights:
        try:
            policy.load_state_dict(torch.load(cfg.init_weights, map_location="cpu"))
        except (OSError, RuntimeError) as err:
            raise ValueError(f"policy.init_weights={cfg.init_weights!r} does not load into policy.kind={cfg.kind}: "
                             f"{err}") from err
    return policy
