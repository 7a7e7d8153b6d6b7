"""HF <-> Megatron weights as a table of name / layout rules, built from the model family (no
per-model code here).

Each `Rule` names a Megatron parameter (with `{i}` for a decoder layer), the HF tensors it holds, how
they are fused, and the dimension tensor parallelism splits (None: replicated over TP); all of it is
the family's (`rlinf_like.models.families`). Conversion splits every HF tensor into its TP shards
first and fuses per rank, because that is how megatron lays out a TP shard:
  * "qkv": per query group g: [q heads of g; k_g; v_g] rows (megatron's interleaved layout),
  * "gate_up": [gate rows of this rank; up rows of this rank],
  * "none": the HF tensor itself.
So an HF name's TP shard is a contiguous block of the HF tensor (the boxes `layouts.py` reports), and
a Megatron shard is undone into its HF pieces rank by rank.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from rlinf_like.hybrid_engines.reshard.layout import split_bounds
from rlinf_like.models.families import ModelFamily
from rlinf_like.models.families.base import Fuse


@dataclass(frozen=True)
class Rule:
    megatron: str
    hf: tuple[str, ...]
    fuse: Fuse = "none"
    tp_dim: int | None = None
    when: str | None = None  # the ModelConfig flag without which the parameter does not exist


L = "decoder.layers.{i}."
# The family names the norms as megatron's local layer spec does; the TransformerEngine spec fuses
# them into the following linear layer.
TE_NAMES = {
    L + "input_layernorm.weight": L + "self_attention.linear_qkv.layer_norm_weight",
    L + "pre_mlp_layernorm.weight": L + "mlp.linear_fc1.layer_norm_weight",
}


@dataclass(frozen=True)
class Heads:
    """What the qkv fusion needs to know."""

    num_heads: int
    num_kv_heads: int
    head_dim: int


def rules_for(family: ModelFamily, te_spec: bool = False) -> tuple[Rule, ...]:
    """One rule per Megatron parameter of the family, under the local or the TransformerEngine spec's names."""
    rules = tuple(Rule(g[0].megatron, tuple(w.hf for w in g), g[0].fuse, g[0].tp_dim, g[0].when)
                  for g in family.parameter_groups())
    return tuple(replace(r, megatron=TE_NAMES.get(r.megatron, r.megatron)) for r in rules) if te_spec else rules


def _pattern(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(re.escape("{i}"), r"(\d+)"))


def match(rules: Sequence[Rule], megatron_name: str) -> tuple[Rule, int | None] | None:
    """The rule for a Megatron parameter name and its layer index (None outside the decoder)."""
    for rule in rules:
        m = _pattern(rule.megatron).fullmatch(megatron_name)
        if m:
            return rule, (int(m.group(1)) if m.groups() else None)
    return None


def hf_names(rule: Rule, layer: int | None) -> list[str]:
    return [name.format(i=layer) for name in rule.hf]


def tp_slice(t: torch.Tensor, dim: int | None, rank: int, size: int) -> torch.Tensor:
    if dim is None:
        return t
    if t.shape[dim] % size:
        raise ValueError(f"dimension {dim} of size {t.shape[dim]} does not split into {size} TP shards")
    lo, hi = split_bounds(t.shape[dim], size)[rank]
    return t.narrow(dim, lo, hi - lo)


def fuse(rule: Rule, parts: Sequence[torch.Tensor], heads: Heads, tp_size: int) -> torch.Tensor:
    """One TP rank's HF pieces -> its Megatron shard."""
    if rule.fuse == "none":
        return parts[0]
    if rule.fuse == "gate_up":
        return torch.cat(list(parts))
    groups = heads.num_kv_heads // tp_size
    q, k, v = (p.reshape(groups, -1, *p.shape[1:]) for p in parts)  # [groups, rows per group, ...]
    return torch.cat([q, k, v], dim=1).reshape(-1, *parts[0].shape[1:])


def unfuse(rule: Rule, shard: torch.Tensor, heads: Heads, tp_size: int) -> list[torch.Tensor]:
    """One TP rank's Megatron shard -> its HF pieces (views for gate_up, copies for qkv)."""
    if rule.fuse == "none":
        return [shard]
    if rule.fuse == "gate_up":
        return list(shard.chunk(2))
    groups = heads.num_kv_heads // tp_size
    per_group = heads.num_heads // heads.num_kv_heads * heads.head_dim
    grouped = shard.reshape(groups, per_group + 2 * heads.head_dim, *shard.shape[1:])
    q, k, v = grouped.split([per_group, heads.head_dim, heads.head_dim], dim=1)
    return [t.reshape(-1, *shard.shape[1:]) for t in (q, k, v)]


def hf_to_megatron(rule: Rule, layer: int | None, hf: Mapping[str, torch.Tensor], heads: Heads,
                   tp_rank: int, tp_size: int) -> torch.Tensor:
    parts = [tp_slice(hf[name], rule.tp_dim, tp_rank, tp_size) for name in hf_names(rule, layer)]
    return fuse(rule, parts, heads, tp_size)


def megatron_to_hf(rule: Rule, layer: int | None, shards: Sequence[torch.Tensor], heads: Heads) -> dict[str, torch.Tensor]:
    """All TP ranks' shards of one Megatron parameter (in TP rank order) -> full HF tensors."""
    names = hf_names(rule, layer)
    if rule.tp_dim is None:
        return dict(zip(names, unfuse(rule, shards[0], heads, 1)))
    pieces = [unfuse(rule, s, heads, len(shards)) for s in shards]
    return {name: torch.cat([p[j] for p in pieces], dim=rule.tp_dim) for j, name in enumerate(names)}
