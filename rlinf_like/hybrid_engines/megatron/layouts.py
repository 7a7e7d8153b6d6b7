"""Megatron shards under HF names: what the generic reshard planner and HF export read.

Every Megatron parameter is undone (by the conversion table) into the HF tensors it holds, whose
shapes the model family gives; each rank then holds, of each HF tensor, the contiguous TP block
along the rule's `tp_dim` when its pipeline stage owns the layer, and nothing otherwise. Data-parallel replicas hold the same boxes
(the planner picks one holder). With tied embeddings the last stage's output layer is a copy of the
embedding and is not reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rlinf_like.hybrid_engines.megatron import convert
from rlinf_like.hybrid_engines.reshard.layout import TensorLayout, full_box, split_bounds
from rlinf_like.models.families import ModelConfig


@dataclass(frozen=True)
class RankCoord:
    tp_rank: int
    pp_rank: int


def rule_applies(rule: convert.Rule, cfg: ModelConfig) -> bool:
    """Whether the model has the parameter's HF tensors (q/k/v biases, an untied output layer)."""
    return rule.when is None or bool(getattr(cfg, rule.when))


def stage_layers(num_layers: int, pp_size: int, pp_rank: int) -> range:
    per = num_layers // pp_size
    return range(pp_rank * per, (pp_rank + 1) * per)


def owns(rule: convert.Rule, layer: int | None, coord: RankCoord, cfg: ModelConfig, pp_size: int) -> bool:
    if layer is not None:
        return layer in stage_layers(cfg.num_layers, pp_size, coord.pp_rank)
    if rule.megatron.startswith("embedding."):
        return coord.pp_rank == 0
    return coord.pp_rank == pp_size - 1  # final norm, output layer


def hf_layouts(cfg: ModelConfig, rules: Sequence[convert.Rule], coords: Sequence[RankCoord], tp_size: int,
               pp_size: int, dtype: torch.dtype) -> list[TensorLayout]:
    """TensorLayouts of every HF tensor over all ranks of the group (`coords[rank]`)."""
    out = []
    for rule in rules:
        if not rule_applies(rule, cfg):
            continue
        layers = range(cfg.num_layers) if "{i}" in rule.megatron else [None]
        for layer in layers:
            for template in rule.hf:
                shape = cfg.shape(cfg.family.weight(template))
                boxes = []
                for coord in coords:
                    if not owns(rule, layer, coord, cfg, pp_size):
                        boxes.append(tuple((0, 0) for _ in shape))
                        continue
                    box = list(full_box(shape))
                    if rule.tp_dim is not None:
                        box[rule.tp_dim] = split_bounds(shape[rule.tp_dim], tp_size)[coord.tp_rank]
                    boxes.append(tuple(box))
                out.append(TensorLayout(template.format(i=layer), shape, tuple(boxes), str(dtype)))
    return out


def hf_named_shards(named_params, rules: Sequence[convert.Rule], heads: convert.Heads, tp_size: int,
                    layer_offset: int, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """This rank's pieces of the HF tensors, from its Megatron parameters (local layer names)."""
    out: dict[str, torch.Tensor] = {}
    for name, param in named_params:
        found = convert.match(rules, name)
        if found is None:
            raise KeyError(f"megatron parameter {name!r} has no conversion rule")
        rule, layer = found
        if not rule_applies(rule, cfg):
            continue
        layer = None if layer is None else layer + layer_offset
        pieces = convert.unfuse(rule, param.detach(), heads, tp_size)
        out.update(zip(convert.hf_names(rule, layer), pieces))
    return out
