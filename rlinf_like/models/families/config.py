"""The fields of an HF config.json every backend builds a decoder from, parsed once."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from rlinf_like.models.families.base import ModelFamily, Weight, family_of


@dataclass(frozen=True)
class Llama3Rope:
    """Llama-3.x RoPE scaling (rope_type "llama3"): low frequencies divided by `factor`, high ones kept,
    the band between interpolated (transformers' `_compute_llama3_parameters`)."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


def _rope_scaling(rope: dict, user: str) -> Llama3Rope | None:
    """The RoPE variant of config.json's rope_parameters (transformers 5) or rope_scaling (older): None for
    the default RoPE, Llama3Rope for "llama3"; any other type is refused naming `user`."""
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type != "llama3":
        raise ValueError(f"{user}: rope type {rope_type!r} ({rope}) is not supported (supported: 'default', 'llama3')")
    try:
        return Llama3Rope(float(rope["factor"]), float(rope["low_freq_factor"]), float(rope["high_freq_factor"]),
                          int(rope["original_max_position_embeddings"]))
    except KeyError as err:
        raise ValueError(f"{user}: rope type 'llama3' needs {err.args[0]!r} in {rope}") from None


SLIDING, FULL = "sliding_attention", "full_attention"  # config.json's layer_types entries


def _layer_types(hf: dict, family: ModelFamily, user: str) -> tuple[str, ...]:
    """Each layer's attention: config.json's layer_types, or (older Gemma 3 configs) every
    sliding_window_pattern-th layer full and the others sliding; a sliding layer in a family without
    sliding-window attention, or with no window size, is refused."""
    n = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None and family.sliding_window and hf.get("sliding_window_pattern"):
        pattern = hf["sliding_window_pattern"]
        types = [SLIDING if (i + 1) % pattern else FULL for i in range(n)]
    types = tuple(types or (FULL,) * n)
    unknown = sorted(set(types) - {SLIDING, FULL})
    if len(types) != n or unknown:
        raise ValueError(f"{user}: layer_types must list {n} entries of {[FULL, SLIDING]} (got {list(types)})")
    if SLIDING in types:
        if not family.sliding_window:
            raise ValueError(f"{user}: layer_types has sliding_attention layers, which the {family.name!r} family "
                             "does not implement")
        if not hf.get("sliding_window"):
            raise ValueError(f"{user}: layer_types has sliding_attention layers but sliding_window is "
                             f"{hf.get('sliding_window')!r}")
    return types


def _ropes(hf: dict) -> tuple[dict, dict]:
    """The RoPE parameters of full and of sliding layers: transformers 5's rope_parameters (one dict, or one
    per layer type), or older configs' rope_theta / rope_scaling / rope_local_base_freq."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if FULL in rope or SLIDING in rope:
        return rope.get(FULL, {}), rope.get(SLIDING, rope.get(FULL, {}))
    full = {"rope_theta": hf.get("rope_theta", 10000.0), **rope}
    local = {"rope_theta": hf["rope_local_base_freq"]} if "rope_local_base_freq" in hf else full
    return full, local


def _check_fixed(hf: dict, family: ModelFamily, user: str) -> None:
    for key, allowed in family.fixed_config:
        if key in hf and hf[key] not in allowed:
            raise ValueError(f"{user}: {key}={hf[key]!r} is not supported by the {family.name!r} family "
                             f"(supported: {list(allowed)})")


@dataclass(frozen=True)
class ModelConfig:
    family: ModelFamily
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool  # q/k/v biases, by the family's rule
    eos_token_ids: tuple[int, ...]
    rope_scaling: Llama3Rope | None = None  # None: the default RoPE
    o_bias: bool = False  # the attention output projection's bias, by the family's rule
    attn_scale: float | None = None  # the attention logits' scale (None: head_dim ** -0.5)
    # per layer: "full_attention" or "sliding_attention" (keys within `sliding_window` positions, RoPE base
    # `sliding_rope_theta`); empty: every layer full
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    sliding_rope_theta: float | None = None
    # mixture of experts (a family with `moe`): per layer whether its MLP is the experts; empty: a dense model
    moe_layers: tuple[bool, ...] = ()
    num_experts: int = 0
    experts_per_token: int = 0  # the router's top-k
    moe_intermediate_size: int = 0  # one expert's MLP width
    norm_topk_prob: bool = False  # the top-k probabilities renormalised to sum to 1

    @classmethod
    def from_hf(cls, hf: dict, user: str = "model", hint: str = "") -> ModelConfig:
        """Refuses, naming `user`, a model_type no family serves, RoPE scaling other than Llama-3's,
        sliding-window attention in a family without it, and any config key the family fixes
        (`ModelFamily.fixed_config`) at another value."""
        family = family_of(hf, user, hint)
        _check_fixed(hf, family, user)
        if hf.get("use_sliding_window"):
            raise ValueError(f"{user}: sliding-window attention (use_sliding_window=true) is not supported")
        types = _layer_types(hf, family, user)
        full, local = _ropes(hf)
        sliding = SLIDING in types
        if sliding and _rope_scaling(local, user) is not None:
            raise ValueError(f"{user}: RoPE scaling of sliding-window layers ({local}) is not supported")
        eos = hf.get("eos_token_id")
        heads = hf["num_attention_heads"]
        attention_bias = family.qkv_bias == "always" or bool(hf.get("attention_bias", False))
        return cls(
            family=family, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"], num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf["rms_norm_eps"], rope_theta=full.get("rope_theta", hf.get("rope_theta", 10000.0)),
            max_position_embeddings=hf["max_position_embeddings"],
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=attention_bias,
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            rope_scaling=_rope_scaling(full, user),
            o_bias=family.o_bias == "configured" and bool(hf.get("attention_bias", False)),
            attn_scale=hf["query_pre_attn_scalar"] ** -0.5 if hf.get("query_pre_attn_scalar") else None,
            layer_types=types if sliding else (),
            sliding_window=hf["sliding_window"] if sliding else None,
            sliding_rope_theta=local.get("rope_theta", hf.get("rope_theta", 10000.0)) if sliding else None,
            **moe_fields(hf, family, user),
        )

    @property
    def is_moe_model(self) -> bool:
        return any(self.moe_layers)

    def is_moe(self, layer: int) -> bool:
        """Whether decoder layer `layer`'s MLP is the mixture of experts."""
        return bool(self.moe_layers) and self.moe_layers[layer]

    @property
    def moe_layer_ids(self) -> tuple[int, ...]:
        return tuple(i for i, sparse in enumerate(self.moe_layers) if sparse)

    def is_sliding(self, layer: int) -> bool:
        return bool(self.layer_types) and self.layer_types[layer] == SLIDING

    @classmethod
    def from_path(cls, path: str | Path, user: str = "model", hint: str = "") -> ModelConfig:
        return cls.from_hf(json.loads((Path(path) / "config.json").read_text()), user, hint)

    # --- what weight shapes and conditions name (see Weight.shape / Weight.when) ----------------------
    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def qk_norm(self) -> bool:
        """Per-head RMSNorm of queries and keys before RoPE (Qwen3)."""
        return self.family.qk_norm

    @property
    def separate_lm_head(self) -> bool:
        return not self.tie_word_embeddings

    @property
    def moe_gate_up_size(self) -> int:
        """The rows of one expert's gate and up projections together (HF's stacked gate_up_proj)."""
        return 2 * self.moe_intermediate_size

    def shape(self, weight: Weight) -> tuple[int, ...]:
        return tuple(getattr(self, dim) for dim in weight.shape)

    def has(self, weight: Weight, layer: int | None = None) -> bool:
        """Whether this model has the weight (its `when` flag holds), and with `layer`, whether that layer does
        (a dense-MLP weight is not in a mixture-of-experts layer, nor an expert in a dense one)."""
        if weight.when is not None and not getattr(self, weight.when):
            return False
        if layer is None or weight.layers == "all":
            return True
        return self.is_moe(layer) == (weight.layers == "moe")

    def named_weights(self) -> list[tuple[str, Weight]]:
        """(HF name, weight) of every tensor this model has in memory: the weights outside the decoder layers,
        then layer by layer, each in the family's order."""
        present = [w for w in self.family.weights if self.has(w)]
        out = [(w.hf, w) for w in present if not w.per_layer]
        for layer in range(self.num_layers):
            out += [(w.hf.format(i=layer), w) for w in present if w.per_layer and self.has(w, layer)]
        return out

    def disk_names(self, name: str, weight: Weight) -> list[str]:
        """The checkpoint tensors the in-memory weight `name` is read from: itself, a renamed one, or one per
        expert and name in `weight.disk`, expert by expert (the order `stack_experts` takes them in)."""
        if not weight.disk:
            return [name]
        layer = {"i": _layer_of(name)} if weight.per_layer else {}
        if not weight.per_expert:
            return [weight.disk[0].format(**layer)]
        return [d.format(e=e, **layer) for e in range(self.num_experts) for d in weight.disk]

    def checkpoint_weights(self) -> dict[str, str]:
        """Every checkpoint tensor this model reads, to the in-memory weight it goes into."""
        return {disk: name for name, weight in self.named_weights() for disk in self.disk_names(name, weight)}


def stack_experts(parts: list, experts: int):
    """The in-memory tensor from its per-expert checkpoint tensors (in `disk_names` order): each expert's
    parts concatenated along rows, the experts stacked."""
    import torch

    per = len(parts) // experts
    return torch.stack([torch.cat(parts[e * per:(e + 1) * per]) for e in range(experts)])


def _layer_of(name: str) -> int:
    return int(re.search(r"\.layers\.(\d+)\.", name).group(1))


def moe_fields(hf: dict, family: ModelFamily, user: str) -> dict:
    """The mixture-of-experts fields of ModelConfig from config.json, as the family's `moe` style names them."""
    if family.moe is None:
        return {}
    n = hf["num_hidden_layers"]
    experts = hf.get("num_experts") or hf.get("num_local_experts")
    top_k = hf.get("num_experts_per_tok")
    if not experts or not top_k or not 0 < top_k <= experts:
        raise ValueError(f"{user}: a {family.name!r} model needs num_experts (or num_local_experts) >= "
                         f"num_experts_per_tok >= 1 (got {experts!r} and {top_k!r})")
    if family.moe == "mixtral":
        return dict(moe_layers=(True,) * n, num_experts=experts, experts_per_token=top_k,
                    moe_intermediate_size=hf["intermediate_size"], norm_topk_prob=True)
    step, dense = hf.get("decoder_sparse_step", 1), set(hf.get("mlp_only_layers") or ())
    sparse = tuple(i not in dense and step > 0 and (i + 1) % step == 0 for i in range(n))
    return dict(moe_layers=sparse, num_experts=experts, experts_per_token=top_k,
                moe_intermediate_size=hf["moe_intermediate_size"], norm_topk_prob=bool(hf.get("norm_topk_prob")))


# saved by older transformers versions, recomputed from config.json: never a weight
_DERIVED_BUFFERS = re.compile(r".*\.rotary_emb\.inv_freq")


def checkpoint_names(path: str | Path) -> set[str]:
    """The tensor names in a checkpoint folder's safetensors files (headers only)."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    names: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    return names


def check_checkpoint(cfg: ModelConfig, names: set[str], user: str = "model") -> None:
    """Every tensor of a checkpoint is one the family maps for this config, and every weight it maps is
    there: an unmapped tensor (an o_proj bias the config does not declare, an MLP bias, a weight of another
    architecture) is refused by name, never dropped. A tied head saved beside its embedding is accepted."""
    expected = set(cfg.checkpoint_weights())
    extra = sorted(n for n in names - expected if not _DERIVED_BUFFERS.fullmatch(n)
                   and not (cfg.tie_word_embeddings and n == cfg.family.tied[0]))
    missing = sorted(expected - names)
    if extra:
        raise ValueError(f"{user}: the checkpoint has tensors the {cfg.family.name!r} family does not map for "
                         f"this config.json: {_some(extra)}; refusing to drop them (a flag such as attention_bias "
                         "may be missing from config.json, or the architecture is another one)")
    if missing:
        raise ValueError(f"{user}: the checkpoint lacks weights this config.json needs: {_some(missing)}")


def _some(names: list[str], n: int = 6) -> str:
    return f"{names[:n]}{f' and {len(names) - n} more' if len(names) > n else ''}"
