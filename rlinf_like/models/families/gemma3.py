"""Gemma 3 (text): the Llama decoder's projections with Gemma's numerics and layer layout.

What differs from Llama: RMSNorm scales by (1 + weight); the input embedding is multiplied by
sqrt(hidden_size); the MLP is GeGLU (tanh GELU); every sub-block's output is normed before the residual add
(post_attention_layernorm on the attention output, pre_/post_feedforward_layernorm around the MLP); q and k
are RMS-normed per head (as Qwen3); attention scales by query_pre_attn_scalar^-1/2; `layer_types` mixes
sliding-window layers (keys within `sliding_window` positions, RoPE base from the sliding entry of
rope_parameters) with full ones (the full entry's base); embeddings are tied.

Megatron-core's GPT layer spec has no norm after a sub-block's output, so the Megatron converter refuses the
family (the Megatron names below only group the fused q/k/v and gate/up weights for the native engine).
"""

from __future__ import annotations

from dataclasses import replace

from rlinf_like.models.families.base import MODEL_FAMILIES, Weight
from rlinf_like.models.families.llama import DECODER_WEIGHTS, LLAMA
from rlinf_like.models.families.qwen3 import QWEN3_WEIGHTS

_L, _H = "decoder.layers.{i}.", "model.layers.{i}."


def _norm(hf: str, megatron: str) -> Weight:
    return Weight(hf=_H + hf + ".weight", shape=("hidden_size",), megatron=_L + megatron + ".weight")


_LLAMA_NORMS = {w.hf for w in DECODER_WEIGHTS if w.hf.endswith("layernorm.weight")}
GEMMA3_WEIGHTS = (
    *(w for w in QWEN3_WEIGHTS if w.hf not in _LLAMA_NORMS),
    _norm("input_layernorm", "input_layernorm"),
    _norm("post_attention_layernorm", "post_self_attn_layernorm"),
    _norm("pre_feedforward_layernorm", "pre_mlp_layernorm"),
    _norm("post_feedforward_layernorm", "post_mlp_layernorm"),
)

GEMMA3 = MODEL_FAMILIES.register(replace(
    LLAMA, name="gemma3", model_types=("gemma3_text",), weights=GEMMA3_WEIGHTS, qk_norm=True,
    norm_plus_one=True, embed_scale=True, activation="gelu_tanh", sandwich_norm=True, sliding_window=True,
    fixed_config=(("hidden_activation", ("gelu_pytorch_tanh",)), ("attn_logit_softcapping", (None,)),
                  ("final_logit_softcapping", (None,)), ("use_bidirectional_attention", (False, None))),
    megatron_refusal="megatron-core's GPT layer spec has no norm after the attention and MLP outputs "
                     "(Gemma's sandwich norms), nor per-layer sliding-window RoPE bases; use actor.backend=fsdp",
))
