"""A megatron-core GPTModel built from an HF Llama / Qwen2-style config, and its forward for our losses.

`transformer_config` maps the HF config (RMSNorm, SwiGLU, RoPE, grouped-query attention, optional q/k/v
biases) onto megatron's TransformerConfig; `build_stage` builds this pipeline stage's part of the model
with TransformerEngine's layer spec when TE imports and megatron's local spec otherwise.
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

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


def te_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None and torch.cuda.is_available()


def hf_dims(hf: dict) -> dict[str, Any]:
    """The fields of an HF config.json the Megatron model needs (refusing what it cannot represent)."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"megatron manager: model_type {model_type!r} is not supported; supported: "
                         f"{list(SUPPORTED_MODEL_TYPES)}")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"megatron manager: rope scaling {rope} is not supported (only the default RoPE)")
    heads = hf["num_attention_heads"]
    return dict(
        vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], ffn_hidden_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"], num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, eps=hf["rms_norm_eps"],
        rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
        max_positions=hf["max_position_embeddings"], tied=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
    )


def check_parallel(d: dict, tp: int, pp: int) -> None:
    """Refuse, by name, a TP/PP size the model's shapes do not split into."""
    for what, n in (("attention heads", d["num_heads"]), ("key/value heads", d["num_kv_heads"]),
                    ("vocabulary rows", d["vocab_size"]), ("MLP rows", d["ffn_hidden_size"])):
        if tp < 1 or n % tp:
            raise ValueError(f"megatron manager: tensor_parallel={tp} must divide the {n} {what}")
    if pp < 1 or d["num_layers"] % pp:
        raise ValueError(f"megatron manager: pipeline_parallel={pp} must divide the {d['num_layers']} layers")


def transformer_config(hf: dict, tp: int, pp: int, dtype: torch.dtype, **overrides):
    from megatron.core.transformer.transformer_config import TransformerConfig

    d = hf_dims(hf)
    check_parallel(d, tp, pp)
    kwargs = dict(
        num_layers=d["num_layers"], hidden_size=d["hidden_size"], ffn_hidden_size=d["ffn_hidden_size"],
        num_attention_heads=d["num_heads"], num_query_groups=d["num_kv_heads"], kv_channels=d["head_dim"],
        normalization="RMSNorm", layernorm_epsilon=d["eps"], gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, add_qkv_bias=d["qkv_bias"], hidden_dropout=0.0, attention_dropout=0.0,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, params_dtype=dtype,
        pipeline_dtype=dtype, bf16=dtype == torch.bfloat16, use_cpu_initialization=not torch.cuda.is_available(),
        # the fused kernels are GPU-only; on GPU they are a speed choice left to `overrides`
        bias_activation_fusion=False, masked_softmax_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, apply_rope_fusion=False, bias_dropout_fusion=False,
        attention_softmax_in_fp32=True, batch_p2p_comm=False,
    )
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def build_stage(config, hf: dict, te_spec: bool, pre_process: bool, post_process: bool) -> nn.Module:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (
        get_gpt_layer_local_spec,
        get_gpt_layer_with_transformer_engine_spec,
    )

    d = hf_dims(hf)
    spec = get_gpt_layer_with_transformer_engine_spec() if te_spec else get_gpt_layer_local_spec(normalization="RMSNorm")
    return GPTModel(
        config=config, transformer_layer_spec=spec, vocab_size=d["vocab_size"], max_sequence_length=d["max_positions"],
        pre_process=pre_process, post_process=post_process, share_embeddings_and_output_weights=d["tied"],
        position_embedding_type="rope", rotary_base=int(d["rope_theta"]), parallel_output=True,
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
