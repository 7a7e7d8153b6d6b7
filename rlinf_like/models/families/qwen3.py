"""Qwen3 (dense): the Llama decoder plus a per-head RMSNorm of queries and keys (over head_dim, before
RoPE); q/k/v biases only when configured (Qwen3 has none); head_dim may differ from hidden / heads."""

from __future__ import annotations

from dataclasses import replace

from rlinf_like.models.families.base import MODEL_FAMILIES, Weight
from rlinf_like.models.families.llama import DECODER_WEIGHTS, LLAMA

_L, _H = "decoder.layers.{i}.", "model.layers.{i}."


def _norm(part: str) -> Weight:
    """q_norm / k_norm: one [head_dim] weight every head shares, so every TP rank holds it whole."""
    return Weight(hf=_H + f"self_attn.{part}_norm.weight", shape=("head_dim",),
                  megatron=_L + f"self_attention.{part}_layernorm.weight")


_O_PROJ = DECODER_WEIGHTS.index(next(w for w in DECODER_WEIGHTS if w.hf.endswith("o_proj.weight")))
QWEN3_WEIGHTS = (*DECODER_WEIGHTS[:_O_PROJ + 1], _norm("q"), _norm("k"), *DECODER_WEIGHTS[_O_PROJ + 1:])

QWEN3 = MODEL_FAMILIES.register(replace(LLAMA, name="qwen3", model_types=("qwen3",), weights=QWEN3_WEIGHTS,
                                        qk_norm=True))
