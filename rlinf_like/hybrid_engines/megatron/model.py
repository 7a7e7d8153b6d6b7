"""A megatron-core GPTModel built from an HF Llama / Qwen2 / Qwen3-style config, and its forward for our losses.

`transformer_config` maps the HF config (RMSNorm, SwiGLU, RoPE, grouped-query attention, optional q/k/v
biases, Qwen3's per-head q/k norms) onto megatron's TransformerConfig; `rope_kwargs` Llama-3 RoPE
scaling onto GPTModel's (megatron fixes its low/high frequency factors and original context);
`build_stage` builds this pipeline stage's part of the model (q/k norms in the layer spec) with
TransformerEngine's layer spec when TE imports and megatron's local spec otherwise.
`LogitsModule` turns the model into what every loss in the project calls: `model(input_ids=...,
attention_mask=...) -> logits` (full vocabulary, gathered over TP), with an explicit causal + padding
mask (megatron's default mask is made on "cuda").
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from rlinf_like.models.families import ModelConfig


def te_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None and torch.cuda.is_available()


def model_config(hf: dict) -> ModelConfig:
    """The HF config.json as the Megatron model needs it (refusing what it cannot represent)."""
    cfg = ModelConfig.from_hf(hf, "megatron manager")
    if cfg.family.megatron_refusal:
        raise ValueError(f"megatron manager: model_type {hf.get('model_type')!r} (the {cfg.family.name!r} family) "
                         f"is not supported: {cfg.family.megatron_refusal}")
    if cfg.o_bias:
        raise ValueError("megatron manager: attention_bias=true with an o_proj bias (model.layers.*.self_attn."
                         "o_proj.bias) is not supported: megatron-core biases either every linear layer "
                         "(add_bias_linear) or q/k/v alone (add_qkv_bias), not the attention output without the "
                         "MLP; use actor.backend=fsdp")
    return cfg


def check_parallel(cfg: ModelConfig, tp: int, pp: int) -> None:
    """Refuse, by name, a TP/PP size the model's shapes do not split into."""
    for what, n in (("attention heads", cfg.num_heads), ("key/value heads", cfg.num_kv_heads),
                    ("vocabulary rows", cfg.vocab_size), ("MLP rows", cfg.intermediate_size)):
        if tp < 1 or n % tp:
            raise ValueError(f"megatron manager: tensor_parallel={tp} must divide the {n} {what}")
    if pp < 1 or cfg.num_layers % pp:
        raise ValueError(f"megatron manager: pipeline_parallel={pp} must divide the {cfg.num_layers} layers")


# megatron's Llama-3 RoPE scaling takes only the factor; the rest is fixed (RotaryEmbedding._apply_scaling)
MEGATRON_LLAMA3_ROPE = dict(low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)


def rope_kwargs(c: ModelConfig) -> dict:
    """GPTModel's RoPE scaling arguments; Llama-3 parameters megatron cannot express are refused."""
    r = c.rope_scaling
    if r is None:
        return {}
    got = dict(low_freq_factor=r.low_freq_factor, high_freq_factor=r.high_freq_factor,
               original_max_position_embeddings=r.original_max_position_embeddings)
    if got != MEGATRON_LLAMA3_ROPE:
        raise ValueError(f"megatron manager: llama3 rope scaling with {got} is not supported (megatron-core fixes "
                         f"{MEGATRON_LLAMA3_ROPE}); use actor.backend=fsdp")
    return dict(rope_scaling=True, rope_scaling_factor=r.factor)


def transformer_config(hf: dict, tp: int, pp: int, dtype: torch.dtype, **overrides):
    from megatron.core.transformer.transformer_config import TransformerConfig

    c = model_config(hf)
    check_parallel(c, tp, pp)
    rope_kwargs(c)  # refused here, before any model is built
    kwargs = dict(
        num_layers=c.num_layers, hidden_size=c.hidden_size, ffn_hidden_size=c.intermediate_size,
        num_attention_heads=c.num_heads, num_query_groups=c.num_kv_heads, kv_channels=c.head_dim,
        normalization="RMSNorm", layernorm_epsilon=c.rms_norm_eps, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=c.attention_bias, qk_layernorm=c.qk_norm,
        hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, params_dtype=dtype,
        pipeline_dtype=dtype, bf16=dtype == torch.bfloat16, use_cpu_initialization=not torch.cuda.is_available(),
        # the fused kernels are GPU-only; on GPU they are a speed choice left to `overrides`
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, apply_rope_fusion=False, bias_dropout_fusion=False,
        attention_softmax_in_fp32=True, batch_p2p_comm=False,
        cuda_graph_scope=[],  # megatron's own default ("full") is deprecated and warns on every build
    )
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def build_stage(config, hf: dict, te_spec: bool, pre_process: bool, post_process: bool) -> nn.Module:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    c = model_config(hf)
    spec = (get_gpt_layer_with_transformer_engine_spec(qk_layernorm=c.qk_norm) if te_spec
            else get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=c.qk_norm))
    return GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=c.vocab_size, max_sequence_length=c.max_position_embeddings,
        pre_process=pre_process, post_process=post_process, share_embeddings_and_output_weights=c.tie_word_embeddings,
        position_embedding_type="rope", rotary_base=int(c.rope_theta), parallel_output=True, **rope_kwargs(c),
    )


def packed_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """The block-diagonal causal mask of packed rows, True where a query may NOT look: the future and
    other sequences. A sequence starts where the position ids do not go up by one (as transformers
    detects packing)."""
    start = torch.ones_like(position_ids[:, :1], dtype=torch.bool)
    segment = torch.cat([start, position_ids[:, 1:] != position_ids[:, :-1] + 1], 1).cumsum(1)
    s = position_ids.shape[1]
    future = torch.ones(s, s, dtype=torch.bool, device=position_ids.device).triu(1)
    return (future[None] | (segment[:, :, None] != segment[:, None, :]))[:, None]


def causal_padding_mask(input_ids: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:
    """Megatron's boolean mask [B, 1, S, S], True where a query may NOT look: the future and padding keys."""
    s = input_ids.shape[1]
    future = torch.ones(s, s, dtype=torch.bool, device=input_ids.device).triu(1)
    mask = future[None, None].expand(input_ids.shape[0], 1, s, s)
    if padding is not None:
        mask = mask | (padding == 0)[:, None, None, :]
    return mask


class LogitsModule(nn.Module):
    """`model(input_ids, attention_mask)` as our losses call it. On the last pipeline stage it returns
    full-vocabulary logits [B, S, V]; on the others the hidden states for the next stage."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, **_: Any) -> torch.Tensor:
        """With `position_ids` (packed rows, no 2-D mask) attention stays inside each sequence. RoPE
        here is applied by row position, not by `position_ids`: within a sequence scores depend only
        on the distance between tokens, so the result is the unpacked one up to float rounding."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        mask = (packed_causal_mask(position_ids) if position_ids is not None and attention_mask is None
                else causal_padding_mask(input_ids, attention_mask))
        return self.model(input_ids, positions, mask, runtime_gather_output=True)


class FixedOutput(nn.Module):
    """Hands a loss function the logits the pipeline already computed, as if it ran the model."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.logits = logits

    def forward(self, *args, **kwargs) -> torch.Tensor:
        return self.logits
