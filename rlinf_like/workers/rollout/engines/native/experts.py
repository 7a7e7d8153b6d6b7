"""The native engine's mixture-of-experts MLP (Qwen3-MoE, Mixtral), as transformers computes it.

A float32 softmax over the router's logits, the top-k experts (renormalised as the family says), each expert's
SwiGLU over the tokens routed to it, weighted and summed. Tokens are sorted by expert once, so Python loops over
the experts hit, never over tokens. The weights are transformers' in-memory layout: the router [experts, hidden],
`gate_up_proj` [experts, 2 x width, hidden] and `down_proj` [experts, hidden, width].
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from rlinf_like.models.families import ModelConfig


def experts_mlp(h: torch.Tensor, router: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                cfg: ModelConfig, act: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The MLP's output (h's shape) and the experts each token chose ([tokens, k], the router's top-k order)."""
    x = h.reshape(-1, h.shape[-1])
    top, chosen = torch.topk(torch.softmax(F.linear(x, router), dim=-1, dtype=torch.float), cfg.experts_per_token,
                             dim=-1)
    if cfg.norm_topk_prob:
        top = top / top.sum(dim=-1, keepdim=True)
    if cfg.family.router_weights_dtype == "model":
        top = top.to(x.dtype)
    flat = chosen.reshape(-1)
    order = torch.argsort(flat, stable=True)
    token = order // cfg.experts_per_token
    counts = torch.bincount(flat, minlength=cfg.num_experts).tolist()
    out = torch.zeros_like(x)
    start = 0
    for expert, n in enumerate(counts):
        if n == 0:
            continue
        rows, slots = token[start:start + n], order[start:start + n]
        gate, up = F.linear(x[rows], gate_up[expert]).chunk(2, dim=-1)
        y = F.linear(act(gate) * up, down[expert]) * top.reshape(-1)[slots, None]
        out.index_add_(0, rows, y.to(out.dtype))
        start += n
    return out.view_as(h), chosen
