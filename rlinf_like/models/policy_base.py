"""What every embodied policy is (a leaf module: the policies and their registry import it).

    actions, logprobs, entropy, values = policy(obs, actions=None, deterministic=False)

With `actions=None` the policy samples (or takes the mode); given actions it scores them (PPO's
training pass). Everything goes through `forward`, so FSDP2's hooks gather the weights. `obs` is a
dict of batched tensors; a policy reads the keys in `obs_keys`. `env_actions` maps the policy's
actions to what the env takes (e.g. action-token bins -> continuous values).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from rlinf_like.config.validate import bounded
from rlinf_like.envs.base import ActionSpec, FieldSpec

PolicyOut = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def use_generator(module: nn.Module, generator: torch.Generator) -> None:
    """Make every sampling part of `module` (the modules declaring a `generator` attribute) draw from `generator`:
    the worker's own, so that its draws do not depend on what else in the process draws from torch's global one
    (other ranks share it on the in-process backend)."""
    for m in module.modules():
        if hasattr(m, "generator"):
            m.generator = generator


def sample(dist: torch.distributions.Distribution, generator: torch.Generator | None) -> torch.Tensor:
    """One draw of a Categorical or Normal from `generator` (None: torch's global one); the same numbers as
    `dist.sample()` from a global generator in the same state."""
    if isinstance(dist, torch.distributions.Categorical):
        probs = dist.probs.reshape(-1, dist.probs.shape[-1])
        return torch.multinomial(probs, 1, True, generator=generator).reshape(dist.batch_shape)
    if isinstance(dist, torch.distributions.Normal):
        with torch.no_grad():
            return torch.normal(dist.loc.expand(dist.batch_shape), dist.scale.expand(dist.batch_shape),
                                generator=generator)
    raise TypeError(f"no seeded draw for {type(dist).__name__}")


@dataclass(kw_only=True)
class PolicyConfig:
    kind: str = "mlp"  # a name in POLICY_REGISTRY (models/policies.py): mlp (state) | vla (image + instruction)
    hidden: list[int] = field(default_factory=lambda: [64, 64])  # mlp
    log_std_init: float = 0.0  # mlp, continuous actions
    bins: int = bounded(7, gt=1)  # vla: action tokens per dimension
    chunk: int = bounded(1, ge=1)  # vla: actions predicted per inference (an action chunk)
    width: int = bounded(32, gt=0)  # vla: conv channels and instruction embedding size
    vocab_size: int = bounded(16, gt=0)  # vla: instruction token ids below this
    init_weights: str | None = None  # a state dict file to start from (e.g. a behaviour-cloning warm start)


class ActorCriticPolicy(nn.Module):
    # What the policy takes and gives, declared by each policy; config checks read these.
    obs_modes: tuple[str, ...] = ("state",)  # the env.obs_mode values whose observations it reads
    obs_keys: tuple[str, ...] = ("state",)  # the observation fields it reads
    action_chunks = False  # predicts policy.chunk actions per inference
    generator: torch.Generator | None = None  # what its sampling draws from (`use_generator`); None: torch's global

    @classmethod
    def from_config(cls, cfg: PolicyConfig, obs_spec: dict[str, FieldSpec], action: ActionSpec) -> ActorCriticPolicy:
        """Build for an env's observation fields and action space; raise naming what does not fit."""
        raise NotImplementedError

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        raise NotImplementedError

    @classmethod
    def action_kind(cls, action: ActionSpec) -> str:
        """What the policy acts in for an env's action space: "discrete" (a categorical per token; the VLA's
        tokens for continuous env actions too) or "continuous". The algorithms' `action_kinds` are checked
        against it."""
        return action.kind

    def action_logits(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """Discrete policies: [B, *token shape, choices] logits, the token shape being what `env_actions` takes
        per row. Discrete SAC reads them as the policy, and a second copy's as Q values per token and choice."""
        raise NotImplementedError(f"{type(self).__name__} does not act in discrete tokens")
