"""Megatron shards under HF names: what the generic reshard planner and HF export read.

Every Megatron parameter is undone (by the conversion table) into the HF tensors it holds; each
rank then holds, of each HF tensor, the contiguous TP block along the rule's `tp_dim` when its
pipeline stage owns the layer, and nothing otherwise. Data-parallel replicas hold the same boxes
(the planner picks one holder). With tied embeddings the last stage's output layer is a copy of the
embedding and is not reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlinf_like.hybrid_engines.megatron import convert
from rlinf_like.hybrid_engines.reshard.layout import TensorLayout, full_box, split_bounds


@dataclass(frozen=True)
class RankCoord:
    tp_rank: int
    pp_rank: int


def hf_shapes(dims: dict) -> dict[str, tuple[int, ...]]:
    """Global shape of every HF tensor name template (`{i}`: a layer)."""
    h, v, ffn = dims["hidden_size"], dims["vocab_size"], dims["ffn_hidden_size"]
    q, kv = dims["num_heads"] * dims["head_dim"], dims["num_kv_heads"] * dims["head_dim"]
    p = convert.H
    shapes = {
        "model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h),
        p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
        p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,), p + "self_attn.v_proj.bias": (kv,),
        p + "mlp.gate_proj.weight": (ffn, h), p + "mlp.up_proj.weight": (ffn, h), p + "mlp.down_proj.weight": (h, ffn),
    }
    return shapes


def rule_applies(rule: convert.Rule, dims: dict) -> bool:
    if rule.megatron.endswith("linear_qkv.bias"):
        return dims["qkv_bias"]
    if rule.megatron == "output_layer.weight":
        return not dims["tied"]
    return True


def stage_layers(num_layers: int, pp_size: int, pp_rank: int) -> range:
    per = num_layers // pp_size
    return range(pp_rank * per, (pp_rank + 1) * per)


def owns(rule: convert.Rule, layer: int | None, coord: RankCoord, dims: dict, pp_size: int) -> bool:
    if layer is not None:
        return layer in stage_layers(dims["num_layers"], pp_size, coord.pp_rank)
    if rule.megatron.startswith("embedding."):
        return coord.pp_rank == 0
    return coord.pp_rank == pp_size - 1  # final norm, output layer


def hf_layouts(dims: dict, rules: Sequence[convert.Rule], coords: Sequence[RankCoord], tp_size: int,
               pp_size: int, dtype: torch.dtype) -> list[TensorLayout]:
    """TensorLayouts of every HF tensor over all ranks of the group (`coords[rank]`)."""
    shapes = hf_shapes(dims)
    out = []
    for rule in rules:
        if not rule_applies(rule, dims):
            continue
        layers = range(dims["num_layers"]) if "{i}" in rule.megatron else [None]
        for layer in layers:
            for template in rule.hf:
                shape = shapes[template]
                boxes = []
                for coord in coords:
                    if not owns(rule, layer, coord, dims, pp_size):
                        boxes.append(tuple((0, 0) for _ in shape))
                        continue
                    box = list(full_box(shape))
                    if rule.tp_dim is not None:
                        box[rule.tp_dim] = split_bounds(shape[rule.tp_dim], tp_size)[coord.tp_rank]
                    boxes.append(tuple(box))
                out.append(TensorLayout(template.format(i=layer), shape, tuple(boxes), str(dtype)))
    return out


def hf_named_shards(named_params, rules: Sequence[convert.Rule], heads: convert.Heads, tp_size: int,
                    layer_offset: int, dims: dict) -> dict[str, torch.Tensor]:
    """This rank's pieces of the HF tensors, from its Megatron parameters (local layer names)."""
    out: dict[str, torch.Tensor] = {}
    for name, param in named_params:
        found = convert.match(rules, name)
        if found is None:
            raise KeyError(f"megatron parameter {name!r} has no conversion rule")
        rule, layer = found
        if not rule_applies(rule, dims):
            continue
        layer = None if layer is None else layer + layer_offset
        pieces = convert.unfuse(rule, param.detach(), heads, tp_size)
        out.update(zip(convert.hf_names(rule, layer), pieces))
    return out
