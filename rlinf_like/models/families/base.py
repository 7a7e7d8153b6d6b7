"""What a model family is, in one place: its HF weights, how tensor parallelism splits each, which
weights Megatron fuses into one parameter, and its config rules (q/k/v biases, tied embeddings).

The native rollout engine, the Megatron converter and the reshard layouts all read these facts from
the family, so they cannot disagree, and a new family is one file that builds a `ModelFamily` and
registers it in `MODEL_FAMILIES` (after torchtitan's ModelSpec + per-model state_dict adapter).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# How tensor parallelism splits a weight (torchtitan's names):
#   "column": output rows (dim 0), "row": input columns (dim 1), "vocab": vocabulary rows (dim 0; the
#   embedding and the LM head, split so in the native engine too), "replicated": every rank holds the whole tensor.
Parallel = Literal["column", "row", "vocab", "replicated"]
_TP_DIM: dict[str, int | None] = {"column": 0, "row": 1, "vocab": 0, "replicated": None}

# How the HF weights sharing one Megatron parameter are laid out in it (see megatron/convert.py).
Fuse = Literal["none", "qkv", "gate_up"]

# Which decoder layers hold a per-layer weight: every one, the dense-MLP ones or the mixture-of-experts ones
# (a MoE family may keep a dense MLP in some layers: Qwen3-MoE's mlp_only_layers / decoder_sparse_step).
Layers = Literal["all", "dense", "moe"]


@dataclass(frozen=True, kw_only=True)
class Weight:
    """One HF tensor; "{i}" in a name stands for a decoder layer's index."""

    hf: str
    shape: tuple[str, ...]  # ModelConfig attributes, e.g. ("q_size", "hidden_size")
    parallel: Parallel = "replicated"
    megatron: str  # the Megatron parameter (local layer spec names) holding it
    fuse: Fuse = "none"  # how it shares that parameter with the other weights naming it
    when: str | None = None  # a ModelConfig flag without which the weight does not exist
    layers: Layers = "all"  # for a per-layer weight: which layers have it
    # the tensor's names in a checkpoint when they differ from `hf`, the in-memory name (transformers' own):
    # one name is a rename; names with "{e}" are per-expert tensors, each expert's concatenated along dim 0 in
    # this order and the experts stacked into dim 0 of the in-memory tensor (HF keeps experts as one
    # [experts, rows, cols] tensor in memory, one tensor per expert and projection on disk)
    disk: tuple[str, ...] = ()

    def __post_init__(self):
        if self.parallel not in _TP_DIM:
            raise ValueError(f"weight {self.hf!r}: parallel={self.parallel!r} is not one of {list(_TP_DIM)}")
        if self.layers != "all" and not self.per_layer:
            raise ValueError(f"weight {self.hf!r}: layers={self.layers!r} needs a per-layer name (with '{{i}}')")
        per_expert = {"{e}" in name for name in self.disk}
        if len(per_expert) > 1 or (len(self.disk) > 1 and per_expert != {True}):
            raise ValueError(f"weight {self.hf!r}: disk names {self.disk} must be one rename or all per expert")

    @property
    def per_expert(self) -> bool:
        """Stacked from one checkpoint tensor per expert (and per name in `disk`)."""
        return any("{e}" in name for name in self.disk)

    @property
    def tp_dim(self) -> int | None:
        """The dimension tensor parallelism splits (None: replicated)."""
        return _TP_DIM[self.parallel]

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.hf


@dataclass(frozen=True, kw_only=True)
class ModelFamily:
    """A decoder architecture as every backend needs it; per-family options are fields with defaults."""

    name: str
    model_types: tuple[str, ...]  # the HF config.json `model_type` values it serves
    weights: tuple[Weight, ...]  # in the order the native engine lays them out
    # q/k/v projection biases: "always" (Qwen2) or "configured" (as config.json's attention_bias says)
    qkv_bias: Literal["always", "configured"] = "configured"
    # (output head, input embedding): one tensor when config.json says tie_word_embeddings
    tied: tuple[str, str] = ("lm_head.weight", "model.embed_tokens.weight")
    # per-head RMSNorm of q and k (over head_dim) before RoPE, with its q_norm / k_norm weights (Qwen3)
    qk_norm: bool = False
    # the attention output projection's bias: "configured" (with the q/k/v biases, as attention_bias says:
    # Llama, Qwen3) or "never" (Qwen2's q/k/v biases come without one)
    o_bias: Literal["never", "configured"] = "configured"
    # RMSNorm scales by (1 + weight), computed in float32 before the cast back (Gemma); else weight * x
    norm_plus_one: bool = False
    # the input embedding multiplied by sqrt(hidden_size) (Gemma; the output head is not)
    embed_scale: bool = False
    # the MLP's gate activation: SwiGLU ("silu") or GeGLU with tanh-approximated GELU ("gelu_tanh", Gemma)
    activation: Literal["silu", "gelu_tanh"] = "silu"
    # norms around each sub-block's output as well as its input (Gemma: post_attention_layernorm is applied to
    # the attention output, then pre_/post_feedforward_layernorm around the MLP)
    sandwich_norm: bool = False
    # config.json's `layer_types` may make layers "sliding_attention": keys only within `sliding_window`
    # positions, RoPE from rope_parameters' sliding entry (Gemma 3); else such a config is refused
    sliding_window: bool = False
    # config.json keys this family does not implement, with the values it accepts (a missing key is accepted):
    # anything else is refused by name rather than silently computed differently
    fixed_config: tuple[tuple[str, tuple], ...] = ()
    # why the Megatron converter refuses this family (None: it converts it)
    megatron_refusal: str | None = None
    # mixture of experts: None (dense), or how its config.json describes the experts: "qwen3_moe" (num_experts,
    # moe_intermediate_size, norm_topk_prob, decoder_sparse_step, mlp_only_layers) or "mixtral" (every layer
    # sparse, num_local_experts experts of intermediate_size, the top-k probabilities always renormalised)
    moe: Literal["qwen3_moe", "mixtral"] | None = None
    # the dtype the chosen experts' router weights multiply the expert outputs in: the model's ("model",
    # transformers' Qwen3-MoE) or float32 then cast back when summed ("float32", Mixtral)
    router_weights_dtype: Literal["model", "float32"] = "model"

    def __post_init__(self):
        names = [w.hf for w in self.weights]
        if len(set(names)) != len(names):
            raise ValueError(f"model family {self.name!r}: a weight is listed twice")
        if not set(self.tied) <= set(names):
            raise ValueError(f"model family {self.name!r}: tied weights {self.tied} are not among its weights")
        self.parameter_groups()  # refuses a fused group whose members disagree
        if self.activation not in ("silu", "gelu_tanh"):
            raise ValueError(f"model family {self.name!r}: activation={self.activation!r} is not one of "
                             "['silu', 'gelu_tanh']")

    def parameter_groups(self) -> list[tuple[Weight, ...]]:
        """The weights grouped by the Megatron parameter holding them, in order of first appearance:
        a fused group (q/k/v, gate/up) or a single weight."""
        groups: dict[str, list[Weight]] = {}
        for w in self.weights:
            groups.setdefault(w.megatron, []).append(w)
        for megatron, members in groups.items():
            if len({(w.fuse, w.parallel, w.when) for w in members}) != 1:
                raise ValueError(f"model family {self.name!r}: the weights of {megatron!r} disagree on how they "
                                 "are fused, split or present")
        return [tuple(members) for members in groups.values()]

    def weight(self, hf: str) -> Weight:
        for w in self.weights:
            if w.hf == hf:
                return w
        raise KeyError(f"model family {self.name!r} has no weight {hf!r}")


class FamilyRegistry:
    """Model families by name, and by the HF model_type each serves."""

    def __init__(self):
        self._families: dict[str, ModelFamily] = {}

    def register(self, family: ModelFamily) -> ModelFamily:
        if family.name in self._families:
            raise ValueError(f"model family {family.name!r} is already registered")
        for model_type in family.model_types:
            other = self.for_model_type(model_type)
            if other is not None:
                raise ValueError(f"model family {family.name!r}: model_type {model_type!r} is already served by "
                                 f"{other.name!r}")
        self._families[family.name] = family
        return family

    def get(self, name: str) -> ModelFamily:
        if name not in self._families:
            raise KeyError(f"model family {name!r} is not registered; supported: {self.names()}")
        return self._families[name]

    def names(self) -> list[str]:
        return list(self._families)

    def model_types(self) -> list[str]:
        return [t for f in self._families.values() for t in f.model_types]

    def for_model_type(self, model_type: str | None) -> ModelFamily | None:
        return next((f for f in self._families.values() if model_type in f.model_types), None)


MODEL_FAMILIES = FamilyRegistry()


def family_of(hf_config: dict, user: str = "model", hint: str = "") -> ModelFamily:
    """The family serving an HF config's model_type; an unknown one is refused naming the supported
    types (`user` names who refuses, `hint` what to do instead)."""
    model_type = hf_config.get("model_type")
    family = MODEL_FAMILIES.for_model_type(model_type)
    if family is None:
        raise ValueError(f"{user}: model_type {model_type!r} is not supported; supported: "
                         f"{MODEL_FAMILIES.model_types()}{f' ({hint})' if hint else ''}")
    return family
