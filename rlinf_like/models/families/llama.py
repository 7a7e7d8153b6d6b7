"""Llama: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP; q/k/v/o biases only when configured
(config.json's attention_bias); MLP biases (mlp_bias) are refused.

Its weight table is the Llama-style decoder other families build on (Qwen2 reuses it as is).
"""

from __future__ import annotations

from rlinf_like.models.families.base import MODEL_FAMILIES, ModelFamily, Weight

_L, _H = "decoder.layers.{i}.", "model.layers.{i}."  # Megatron's and HF's per-layer prefixes


def _qkv(part: str, size: str, suffix: str) -> Weight:
    """q, k or v projection's weight or bias: column parallel, fused per query group by Megatron."""
    shape = (size, "hidden_size") if suffix == "weight" else (size,)
    return Weight(hf=_H + f"self_attn.{part}_proj.{suffix}", shape=shape, parallel="column",
                  megatron=_L + f"self_attention.linear_qkv.{suffix}", fuse="qkv",
                  when="attention_bias" if suffix == "bias" else None)


def _gate_up(part: str) -> Weight:
    return Weight(hf=_H + f"mlp.{part}_proj.weight", shape=("intermediate_size", "hidden_size"), parallel="column",
                  megatron=_L + "mlp.linear_fc1.weight", fuse="gate_up")


DECODER_WEIGHTS: tuple[Weight, ...] = (
    Weight(hf="model.embed_tokens.weight", shape=("vocab_size", "hidden_size"), parallel="vocab",
           megatron="embedding.word_embeddings.weight"),
    Weight(hf="model.norm.weight", shape=("hidden_size",), megatron="decoder.final_layernorm.weight"),
    Weight(hf="lm_head.weight", shape=("vocab_size", "hidden_size"), parallel="vocab",
           megatron="output_layer.weight", when="separate_lm_head"),
    Weight(hf=_H + "input_layernorm.weight", shape=("hidden_size",), megatron=_L + "input_layernorm.weight"),
    Weight(hf=_H + "post_attention_layernorm.weight", shape=("hidden_size",),
           megatron=_L + "pre_mlp_layernorm.weight"),
    *(_qkv(part, size, suffix) for part, size in (("q", "q_size"), ("k", "kv_size"), ("v", "kv_size"))
      for suffix in ("weight", "bias")),
    Weight(hf=_H + "self_attn.o_proj.weight", shape=("hidden_size", "q_size"), parallel="row",
           megatron=_L + "self_attention.linear_proj.weight"),
    # a row-parallel layer's bias: every rank holds it whole and adds it once, after the all-reduce
    Weight(hf=_H + "self_attn.o_proj.bias", shape=("hidden_size",), megatron=_L + "self_attention.linear_proj.bias",
           when="o_bias"),
    _gate_up("gate"),
    _gate_up("up"),
    Weight(hf=_H + "mlp.down_proj.weight", shape=("hidden_size", "intermediate_size"), parallel="row",
           megatron=_L + "mlp.linear_fc2.weight"),
)

LLAMA = MODEL_FAMILIES.register(ModelFamily(name="llama", model_types=("llama",), weights=DECODER_WEIGHTS,
                                            fixed_config=(("mlp_bias", (False,)), ("hidden_act", ("silu",)))))
