"""A small vision-language-action policy: image + tokenized instruction -> action tokens + value.

RT-2 / OpenVLA style at toy scale: each action dimension is discretized into `bins` tokens (a
chunk of `chunk` future actions is predicted at once), and the policy is a product of
categoricals over them. The image encoder is a small CNN (frame normalized to [-0.5, 0.5]; a 5x5
conv with stride 2, then a 1x1 conv) whose per-pixel features are read by `keypoints` attention heads:
each head's query is a learned vector plus a projection of the instruction embedding (mean over
its tokens), its softmax over the image gives an expected (x, y). So the instruction selects where
to look (cross-attention from language to pixels), and the trunk gets positions, the few numbers a
reaching policy needs. (An earlier encoder that flattened the conv features into the trunk did not
learn this task from pixels within 15 minutes; see docs/architecture.md.) Keypoints, the
instruction embedding and proprioception join an MLP trunk shared by the action-token head and the
value head.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.distributions import Categorical

from rlinf_like.envs.base import ActionSpec, FieldSpec
from rlinf_like.models.policy_base import ActorCriticPolicy, PolicyConfig, PolicyOut, sample


class KeypointAttention(nn.Module):
    """Per-pixel features [B, C, H, W] and instruction embeddings [B, E] -> [B, 2K]: for each of K
    heads, the expected (x, y) in [-1, 1] under softmax(query . feature) over the pixels, where the
    query is a learned vector plus a projection of the instruction."""

    def __init__(self, size: int, channels: int, embed: int, heads: int):
        super().__init__()
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
        self.register_buffer("grid", torch.stack([xs.flatten(), ys.flatten()], 1), persistent=False)  # [HW, 2]
        self.heads, self.channels = heads, channels
        self.query = nn.Parameter(torch.randn(heads, channels))
        self.from_words = nn.Linear(embed, heads * channels)
        self.log_scale = nn.Parameter(torch.full((1,), 2.0))  # 1-D: FSDP2 does not shard scalars

    def forward(self, features: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
        query = self.query + self.from_words(words).view(-1, self.heads, self.channels)  # [B, K, C]
        # sharp from the start (a learned scale, initially e^2): the few target pixels must outweigh
        # hundreds of background ones, or every keypoint sits at the image centre
        logits = query @ features.flatten(2) * self.log_scale.exp()  # [B, K, HW]
        return (torch.softmax(logits, dim=-1) @ self.grid).flatten(1)


class VLAPolicy(ActorCriticPolicy):
    obs_modes = ("pixels",)
    obs_keys = ("image", "instruction", "state")
    action_chunks = True

    @classmethod
    def from_config(cls, cfg: PolicyConfig, obs_spec: dict[str, FieldSpec], action: ActionSpec) -> VLAPolicy:
        return cls(obs_spec, action, cfg.bins, cfg.chunk, cfg.width, cfg.vocab_size)

    def __init__(self, obs_spec: dict[str, FieldSpec], action: ActionSpec, bins: int = 7, chunk: int = 1,
                 width: int = 32, vocab_size: int = 16, trunk: int = 128, keypoints: int = 16):
        super().__init__()
        missing = {"image", "instruction"} - set(obs_spec)
        if missing or action.kind != "continuous":
            raise ValueError(f"policy.kind=vla needs image + instruction observations and continuous actions "
                             f"(to discretize); the env gives {sorted(obs_spec)} and {action.kind} actions")
        if obs_spec["instruction"].vocab > vocab_size:
            raise ValueError(f"policy.vocab_size={vocab_size} is below the env's instruction vocabulary "
                             f"({obs_spec['instruction'].vocab} token ids): set policy.vocab_size>="
                             f"{obs_spec['instruction'].vocab}")
        size = obs_spec["image"].shape[0]
        self.action, self.bins, self.chunk = action, bins, chunk
        self.act_dim = int(np.prod(action.shape))
        self.proprio_dim = int(np.prod(obs_spec["state"].shape)) if "state" in obs_spec else 0
        self.conv = nn.Sequential(nn.Conv2d(3, width, 5, 2, 2), nn.ReLU(),  # stride 2: a quarter of the pixels
                                  nn.Conv2d(width, width, 1))  # per-pixel features: colour and place
        self.embed = nn.Embedding(vocab_size, width, padding_idx=0)
        self.keypoints = KeypointAttention((size + 1) // 2, width, width, keypoints)
        self.trunk = nn.Sequential(nn.Linear(2 * keypoints + width + self.proprio_dim, trunk), nn.ReLU(),
                                   nn.Linear(trunk, trunk), nn.ReLU())
        self.action_head = nn.Linear(trunk, chunk * self.act_dim * bins)
        self.value_head = nn.Linear(trunk, 1)
        nn.init.zeros_(self.action_head.weight)  # uniform over tokens at the start: maximal exploration
        nn.init.zeros_(self.action_head.bias)
        low, high = torch.tensor(action.low), torch.tensor(action.high)
        self.register_buffer("centres", low[:, None] + (high - low)[:, None] * torch.linspace(0, 1, bins)[None],
                             persistent=False)  # [act_dim, bins]: token -> value

    def features(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """The trunk's output [B, trunk], read by the action-token and value heads."""
        image = obs["image"].permute(0, 3, 1, 2).float() / 255.0 - 0.5
        tokens = obs["instruction"].long()
        words = self.embed(tokens).sum(1) / (tokens != 0).sum(1, keepdim=True).clamp(min=1)
        points = self.keypoints(self.conv(image), words)
        parts = [points, words] + ([obs["state"].float()] if self.proprio_dim else [])
        return self.trunk(torch.cat(parts, 1))

    @classmethod
    def action_kind(cls, action: ActionSpec) -> str:
        return "discrete"  # tokens, whatever the env takes

    def action_logits(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """[B, chunk, act_dim, bins]."""
        return self.action_head(self.features(obs)).view(-1, self.chunk, self.act_dim, self.bins)

    def forward(self, obs: dict[str, torch.Tensor], actions: torch.Tensor | None = None,
                deterministic: bool = False) -> PolicyOut:
        z = self.features(obs)
        logits = self.action_head(z).view(-1, self.chunk, self.act_dim, self.bins)
        dist = Categorical(logits=logits)
        if actions is None:
            actions = logits.argmax(-1) if deterministic else sample(dist, self.generator)
        return actions, dist.log_prob(actions).sum((1, 2)), dist.entropy().sum((1, 2)), self.value_head(z).squeeze(-1).clone()

    def tokens(self, values: np.ndarray) -> torch.Tensor:
        """Continuous actions [B, act_dim] -> the nearest token ids [B, chunk, act_dim] (chunk repeats them),
        e.g. to label an expert's actions for behaviour cloning."""
        values = torch.as_tensor(values, dtype=self.centres.dtype).reshape(-1, 1, self.act_dim, 1)
        return (values - self.centres[None, None]).abs().argmin(-1).expand(-1, self.chunk, -1)

    def env_actions(self, actions: torch.Tensor) -> np.ndarray:
        """Token ids [B, chunk, act_dim] -> continuous actions [B, chunk, act_dim] (or [B, act_dim])."""
        values = self.centres[torch.arange(self.act_dim), actions.long()].detach().cpu().numpy()
        return values[:, 0] if self.chunk == 1 else values
