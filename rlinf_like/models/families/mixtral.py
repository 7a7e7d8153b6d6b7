"""Mixtral: Llama's attention with a mixture-of-experts MLP in every layer (`block_sparse_moe` on disk,
experts' w1 / w3 / w2 = gate / up / down). The router takes a softmax in float32 over `num_local_experts`,
keeps the top `num_experts_per_tok` and always renormalises them; it weights the expert outputs in float32.
This is also the layout of a dense model sparse-upcycled (`python -m rlinf_like.models.upcycle`).

Not implemented, so refused: sliding-window attention, and router jitter noise (transformers applies it in
training only, which would make the trainer's forward differ from the engine's by design)."""

from __future__ import annotations

from dataclasses import replace

from rlinf_like.models.families.base import MODEL_FAMILIES
from rlinf_like.models.families.llama import DECODER_WEIGHTS, LLAMA
from rlinf_like.models.families.moe import MOE_MEGATRON_REFUSAL, expert_weights

_DENSE_MLP = ("mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")

MIXTRAL_WEIGHTS = (
    *(w for w in DECODER_WEIGHTS if not w.hf.endswith(_DENSE_MLP)),
    *expert_weights("block_sparse_moe.", gate="w1", up="w3", down="w2"),
)

MIXTRAL = MODEL_FAMILIES.register(replace(
    LLAMA, name="mixtral", model_types=("mixtral",), weights=MIXTRAL_WEIGHTS, moe="mixtral",
    router_weights_dtype="float32", megatron_refusal=MOE_MEGATRON_REFUSAL,
    fixed_config=(("hidden_act", ("silu",)), ("sliding_window", (None,)), ("router_jitter_noise", (0, 0.0, None)))))
