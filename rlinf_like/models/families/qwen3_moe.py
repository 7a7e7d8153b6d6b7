"""Qwen3-MoE: Qwen3's attention (per-head q/k norms) with a mixture-of-experts MLP in every
`decoder_sparse_step`-th layer not listed in `mlp_only_layers` (those keep Qwen3's dense MLP). The router
takes a softmax over `num_experts` in float32, keeps the top `num_experts_per_tok`, and renormalises them
when `norm_topk_prob` says so."""

from __future__ import annotations

from dataclasses import replace

from rlinf_like.models.families.base import MODEL_FAMILIES
from rlinf_like.models.families.moe import MOE_MEGATRON_REFUSAL, expert_weights
from rlinf_like.models.families.qwen3 import QWEN3, QWEN3_WEIGHTS

_DENSE_MLP = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")

QWEN3_MOE_WEIGHTS = (
    *(replace(w, layers="dense") if w.hf.endswith(_DENSE_MLP) else w for w in QWEN3_WEIGHTS),
    *expert_weights("mlp.", gate="gate_proj", up="up_proj", down="down_proj"),
)

QWEN3_MOE = MODEL_FAMILIES.register(replace(
    QWEN3, name="qwen3_moe", model_types=("qwen3_moe",), weights=QWEN3_MOE_WEIGHTS, moe="qwen3_moe",
    megatron_refusal=MOE_MEGATRON_REFUSAL,
    fixed_config=(("mlp_bias", (False,)), ("hidden_act", ("silu",)), ("use_sliding_window", (False, None)))))
