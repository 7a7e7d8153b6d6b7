"""The mixture-of-experts MLP's weights, shared by the MoE families (Qwen3-MoE, Mixtral).

In memory they are transformers' own: the router `mlp.gate.weight` [experts, hidden], and the experts stacked
as `mlp.experts.gate_up_proj` [experts, 2 x expert width, hidden] and `mlp.experts.down_proj` [experts, hidden,
expert width], so the FSDP2 actor's HF model, the weight sync and the native engine share names and shapes.
On disk each expert's projections are tensors of their own (`Weight.disk`), which the loaders stack.
"""

from __future__ import annotations

from rlinf_like.models.families.base import Weight

_L, _H = "decoder.layers.{i}.", "model.layers.{i}."


def expert_weights(disk_scope: str, gate: str, up: str, down: str) -> tuple[Weight, ...]:
    """Router and stacked experts of a MoE layer, read from `disk_scope` + "experts.{e}." + the projections'
    checkpoint names. Experts are replicated across tensor-parallel ranks (the native engine refuses tp > 1
    for them), and Megatron's names are only for grouping: the MoE families' Megatron conversion is refused."""
    expert = _H + disk_scope + "experts.{e}."
    return (
        Weight(hf=_H + "mlp.gate.weight", shape=("num_experts", "hidden_size"), megatron=_L + "mlp.router.weight",
               layers="moe", disk=() if disk_scope == "mlp." else (_H + disk_scope + "gate.weight",)),
        Weight(hf=_H + "mlp.experts.gate_up_proj", shape=("num_experts", "moe_gate_up_size", "hidden_size"),
               megatron=_L + "mlp.experts.linear_fc1.weight", layers="moe",
               disk=(expert + gate + ".weight", expert + up + ".weight")),
        Weight(hf=_H + "mlp.experts.down_proj", shape=("num_experts", "hidden_size", "moe_intermediate_size"),
               megatron=_L + "mlp.experts.linear_fc2.weight", layers="moe", disk=(expert + down + ".weight",)),
    )


MOE_MEGATRON_REFUSAL = ("the Megatron converter has no mixture-of-experts layers (expert-parallel MLPs, routing "
                        "replay); use actor.backend=fsdp")
