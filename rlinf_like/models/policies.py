"""Actor-critic policies for embodied RL, behind one call:

    actions, logprobs, entropy, values = policy(obs, actions=None, deterministic=False)

With `actions=None` the policy samples (or takes the mode); given actions it scores them (PPO's
training pass). Everything goes through `forward`, so FSDP2's hooks gather the weights. `obs` is a
dict of batched tensors; a policy reads the keys in `obs_keys`. `env_actions` maps the policy's
actions to what the env takes (e.g. action-token bins -> continuous values).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical, Normal

from rlinf_like.envs.base import ActionSpec, FieldSpec

PolicyOut = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


@dataclass(kw_only=True)
class PolicyConfig:
    kind: Literal["mlp", "vla"] = "mlp"  # mlp (state) | vla (image + instruction -> action tokens)
    hidden: list[int] = field(default_factory=lambda: [64, 64])  # mlp
    log_std_init: float = 0.0  # mlp, continuous actions
    bins: int = 7  # vla: action tokens per dimension
    chunk: int = 1  # vla: actions predicted per inference (an action chunk)
    width: int = 32  # vla: conv channels and instruction embedding size
    vocab_size: int = 16  # vla: instruction token ids below this
    init_weights: str | None = None  # a state dict file to start from (e.g. a behaviour-cloning warm start)


def _mlp(sizes: list[int], out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        linear = nn.Linear(a, b)
        last = i == len(sizes) - 2
        nn.init.orthogonal_(linear.weight, out_gain if last else math.sqrt(2))  # SB3's PPO init
        nn.init.zeros_(linear.bias)
        layers += [linear] if last else [linear, nn.Tanh()]
    return nn.Sequential(*layers)


class MLPActorCritic(nn.Module):
    """Separate tanh MLPs for policy and value (as SB3's MlpPolicy): a Gaussian with a learned,
    state-independent log std for continuous actions, a categorical for discrete ones."""

    obs_keys = ("state",)

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
                actions = head if deterministic else dist.sample()
            return actions, dist.log_prob(actions).sum(-1), dist.entropy().sum(-1), values
        dist = Categorical(logits=head)
        if actions is None:
            actions = head.argmax(-1) if deterministic else dist.sample()
        return actions, dist.log_prob(actions), dist.entropy(), values

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        return actions.detach().cpu().numpy()


def build_policy(cfg: PolicyConfig, obs_spec: dict[str, FieldSpec], action: ActionSpec) -> nn.Module:
    policy = _build(cfg, obs_spec, action)
    if cfg.init_weights:
        try:
            policy.load_state_dict(torch.load(cfg.init_weights, map_location="cpu"))
        except (OSError, RuntimeError) as err:
            raise ValueError(f"policy.init_weights={cfg.init_weights!r} does not load into policy.kind={cfg.kind}: "
                             f"{err}") from err
    return policy


def _build(cfg: PolicyConfig, obs_spec: dict[str, FieldSpec], action: ActionSpec) -> nn.Module:
    if cfg.kind == "mlp":
        if set(obs_spec) != {"state"}:
            raise ValueError(f"policy.kind=mlp takes state observations; the env gives {sorted(obs_spec)} "
                             "(use policy.kind=vla for pixels)")
        return MLPActorCritic(int(np.prod(obs_spec["state"].shape)), action, list(cfg.hidden), cfg.log_std_init)
    if cfg.kind == "vla":
        from rlinf_like.models.vla import VLAPolicy

        return VLAPolicy(obs_spec, action, cfg.bins, cfg.chunk, cfg.width, cfg.vocab_size)
    raise ValueError(f"policy.kind={cfg.kind!r} is not one of ['mlp', 'vla']")
