"""The native decoder's pure pieces, as transformers computes them: RoPE frequencies, RMSNorm, the rotation, and
attention for one query per sequence over gathered cache rows."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from rlinf_like.models.families import ModelConfig


def rope_inv_freq(cfg: ModelConfig, sliding: bool = False) -> torch.Tensor:
    """RoPE's inverse frequencies [head_dim / 2], as transformers computes them: the default RoPE, or
    Llama-3's scaling (long wavelengths divided by the factor, short ones kept, the band between
    interpolated); `sliding`: the sliding-window layers' base (Gemma 3), always the default RoPE."""
    dim = cfg.head_dim
    theta = cfg.sliding_rope_theta if sliding else cfg.rope_theta
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    r = cfg.rope_scaling
    if r is None or sliding:
        return inv_freq
    low_wavelen = r.original_max_position_embeddings / r.low_freq_factor
    high_wavelen = r.original_max_position_embeddings / r.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / r.factor, inv_freq)
    smooth = ((r.original_max_position_embeddings / wavelen - r.low_freq_factor)
              / (r.high_freq_factor - r.low_freq_factor))
    smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rms_norm_plus_one(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: scaled by (1 + weight) in float32, then cast (Llama casts before scaling)."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * (1.0 + weight.float())).to(x.dtype)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


def window_mask(start: int, length: int, window: int | None, device) -> torch.Tensor | None:
    """Which keys the queries at positions start .. start + length - 1 see, keys at positions 0 .. start +
    length - 1: causal, and within `window` positions (key > query - window, as transformers) when given.
    None when that is plain causal attention from position 0 (the fused kernel's own mask, bit-for-bit)."""
    if start == 0 and (window is None or window >= length):
        return None
    query = torch.arange(start, start + length, device=device)[:, None]
    key = torch.arange(start + length, device=device)[None]
    seen = key <= query
    return seen if window is None else seen & (key > query - window)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def decode_attention(q: torch.Tensor, keys_t: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
                     scale: float | None = None) -> torch.Tensor:
    """One query per sequence: q [B, H, 1, d], keys transposed [KV, B, d, T] and values [KV, B, T, d] (each
    sequence's blocks gathered), additive mask [B, 1, 1, T]; scores scaled by `scale` (default d^-1/2).
    Plain batched matmuls with the query heads grouped under their key/value head: no copy of the
    cache for GQA, and on CPU much faster than the fused kernel is for a single query row. Keys come
    transposed so the score product reads them in place (a bf16 batched matmul copies a transposed
    operand every call); scaling and softmax run in float32 (bf16 scores are rounded once, not twice)."""
    b, heads, _, d = q.shape
    kv = keys_t.shape[0]
    grouped = q.view(b, kv, heads // kv, d).transpose(0, 1).contiguous()  # [KV, B, G, d]
    scale = d**-0.5 if scale is None else scale
    scores = torch.matmul(grouped, keys_t).float() * scale + mask.view(1, b, 1, -1)  # [KV, B, G, T]
    out = torch.matmul(scores.softmax(dim=-1).to(values.dtype), values)  # [KV, B, G, d]
    return out.transpose(0, 1).reshape(b, heads, 1, d)
