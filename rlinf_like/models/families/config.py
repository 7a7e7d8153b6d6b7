"""The fields of an HF config.json every backend builds a decoder from, parsed once."""

from __future__ import annotations

import json
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

    @classmethod
    def from_hf(cls, hf: dict, user: str = "model", hint: str = "") -> ModelConfig:
        """Refuses, naming `user`, a model_type no family serves, RoPE scaling other than Llama-3's, and
        sliding-window attention."""
        family = family_of(hf, user, hint)
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        if hf.get("use_sliding_window"):
            raise ValueError(f"{user}: sliding-window attention (use_sliding_window=true) is not supported")
        eos = hf.get("eos_token_id")
        heads = hf["num_attention_heads"]
        return cls(
            family=family, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"], num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            rms_norm_eps=hf["rms_norm_eps"], rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)),
            max_position_embeddings=hf["max_position_embeddings"],
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=family.qkv_bias == "always" or bool(hf.get("attention_bias", False)),
            eos_token_ids=tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)),
            rope_scaling=_rope_scaling(rope, user),
        )

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

    def shape(self, weight: Weight) -> tuple[int, ...]:
        return tuple(getattr(self, dim) for dim in weight.shape)

    def has(self, weight: Weight) -> bool:
        """Whether this model has the weight (its `when` flag holds)."""
        return weight.when is None or bool(getattr(self, weight.when))

    def named_weights(self) -> list[tuple[str, Weight]]:
        """(HF name, weight) of every tensor this model has: the weights outside the decoder layers, then
        layer by layer, each in the family's order."""
        present = [w for w in self.family.weights if self.has(w)]
        out = [(w.hf, w) for w in present if not w.per_layer]
        for layer in range(self.num_layers):
            out += [(w.hf.format(i=layer), w) for w in present if w.per_layer]
        return out
