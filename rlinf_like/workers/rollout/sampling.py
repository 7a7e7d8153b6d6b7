"""Token sampling for a batch of sequences with per-row parameters, reproducible per sequence.

Randomness comes from a counter-based hash of (sequence seed, step, token id) rather than a
stateful generator, so a sequence's samples depend only on its own seed: not on which other
sequences share the batch, on the batch order, or on the tensor-parallel rank (every rank draws
the same tokens without a broadcast). A category is drawn with the Gumbel-max trick:
argmax(log p + G) is distributed as p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (good avalanche), on int64 tensors holding values < 2**32."""
    x = x & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


def uniform_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """U(0, 1) of shape [B, vocab], a pure function of (seed, step, token id)."""
    base = _mix32(_mix32(seeds) ^ (steps * 0x9E3779B9))
    ids = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    bits = _mix32(base[:, None] ^ _mix32(ids + 0x632BE5AB)[None])
    return (bits.double() + 0.5) / 2.0**32


@dataclass
class RowParams:
    """Per-row sampling parameters as tensors (temperature 0 rows are greedy)."""

    temperature: torch.Tensor  # float [B]
    top_k: torch.Tensor  # int64 [B], 0 = off
    top_p: torch.Tensor  # float [B]
    seeds: torch.Tensor  # int64 [B]
    steps: torch.Tensor  # int64 [B], tokens generated so far


def sample(logits: torch.Tensor, params: RowParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B], logprobs [B]); logprobs under softmax(logits / temperature), before top-k/top-p."""
    greedy = params.temperature == 0
    temperature = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    scaled = logits.float() / temperature[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)
    tokens = scaled.argmax(dim=-1)
    if not bool(greedy.all()):
        filtered = _filter(scaled, params.top_k, params.top_p)
        gumbel = -torch.log(-torch.log(uniform_noise(params.seeds, params.steps, logits.shape[-1]))).float()
        drawn = (torch.log_softmax(filtered, dim=-1) + gumbel).argmax(dim=-1)
        tokens = torch.where(greedy, tokens, drawn)
    return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]


def _filter(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p nucleus to -inf (the top token always stays)."""
    if bool((top_k == 0).all()) and bool((top_p >= 1.0).all()):
        return scaled
    vocab = scaled.shape[-1]
    ordered, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=scaled.device)[None]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    ordered = ordered.masked_fill(rank >= k[:, None], float("-inf"))
    probs = torch.softmax(ordered, dim=-1)  # top-p applies to what top-k kept, as in transformers
    ordered = ordered.masked_fill((probs.cumsum(-1) - probs) >= top_p[:, None], float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(-1, order, ordered)
