"""Model FLOPs of a decoder's phases, counted from its config and the tokens a step computed.

Only matrix products count (the convention of MFU in PaLM, torchtitan and nanochat): norms, activations, softmax
and the optimizer are left out, and so is work done twice by choice (activation recomputation), so that a step
that does less needless work shows a higher utilization, never a lower one.

For a sequence of T tokens a forward costs, per layer, 2 FLOPs per weight per token for the projections and the
MLP (`body_params`), plus 2 x 2 x heads x head_dim per (query, key) pair for the scores and the weighted sum;
a causal layer has T(T+1)/2 pairs. The output layer costs 2 x hidden x vocab per position it is applied at: in
training only the response positions (the chunked head reads those), in the engine one per decoded token. A
backward costs twice its forward (the gradients of the inputs and of the weights); with frozen base weights (LoRA)
only the inputs' gradients are computed, so once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    # mixture of experts: how many layers are sparse, and per token in each, the router (experts) and the chosen
    # experts' MLPs (top_k of expert_width); the other layers keep the dense MLP of `intermediate`
    moe_layers: int = 0
    experts: int = 0
    top_k: int = 0
    expert_width: int = 0

    @classmethod
    def from_hf_config(cls, config: dict) -> ModelShape:
        c = config.get("text_config", config)  # multimodal configs (Gemma 3) nest the decoder's
        heads = c["num_attention_heads"]
        return cls(layers=c["num_hidden_layers"], hidden=c["hidden_size"], heads=heads,
                   kv_heads=c.get("num_key_value_heads") or heads,
                   head_dim=c.get("head_dim") or c["hidden_size"] // heads,
                   intermediate=c["intermediate_size"], vocab=c["vocab_size"], **moe_shape(c))

    @classmethod
    def from_path(cls, model_path: str | Path) -> ModelShape:
        return cls.from_hf_config(json.loads((Path(model_path) / "config.json").read_text()))

    @property
    def body_params(self) -> int:
        """Weights of the matrix products every token goes through: attention projections and the gated MLP."""
        attn = self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)  # q, o; k, v
        sparse = self.hidden * (self.experts + 3 * self.top_k * self.expert_width)  # router, the chosen experts
        return self.layers * attn + (self.layers - self.moe_layers) * 3 * self.hidden * self.intermediate \
            + self.moe_layers * sparse

    @property
    def pair_cost(self) -> float:
        """Attention FLOPs per query-key pair over the body's FLOPs per token."""
        return 4.0 * self.layers * self.heads * self.head_dim / (2.0 * self.body_params)

    @property
    def head_params(self) -> int:
        return self.hidden * self.vocab

    def forward(self, tokens: int, head_positions: int, context: int = 0) -> float:
        """One causal forward over `tokens` new tokens after `context` cached ones, with the output layer applied at
        `head_positions` of them."""
        pairs = tokens * context + tokens * (tokens + 1) / 2
        return (2.0 * self.body_params * tokens + 4.0 * self.layers * self.heads * self.head_dim * pairs
                + 2.0 * self.head_params * head_positions)


def moe_shape(config: dict) -> dict:
    """ModelShape's mixture-of-experts fields, by the model family's own reading of config.json (none if dense)."""
    from rlinf_like.models.families import MODEL_FAMILIES
    from rlinf_like.models.families.config import moe_fields

    family = MODEL_FAMILIES.for_model_type(config.get("model_type"))
    if family is None or family.moe is None:
        return {}
    moe = moe_fields(config, family, "model FLOPs")
    return dict(moe_layers=sum(moe["moe_layers"]), experts=moe["num_experts"], top_k=moe["experts_per_token"],
                expert_width=moe["moe_intermediate_size"])


def train_flops(shape: ModelShape, rows: Sequence[tuple[int, int]], *, updates: int = 1, forwards: int = 0,
                frozen_base: bool = False) -> float:
    """A training phase over `rows` of (prompt tokens, response tokens): `updates` forward-backward passes over
    every row (epochs), `forwards` forward-only passes (the reference's, a recomputation of pi_old's logprobs)."""
    forward = sum(shape.forward(p + r, head_positions=r) for p, r in rows)
    backward = 1.0 if frozen_base else 2.0
    return forward * (updates * (1.0 + backward) + forwards)


def shared_forward(shape: ModelShape, requests: Sequence[tuple[int, Sequence[int]]]) -> float:
    """One training forward over every sample of `requests` (prompt tokens, each sample's response tokens) with
    each request's prompt run once and its samples after it (`actor.loop.share_prompt`): a response attends to the
    prompt and its own past, and the output layer runs at its tokens' positions only."""
    return sum(shape.forward(p, head_positions=0) + sum(shape.forward(r, head_positions=r, context=p) for r in rs)
               for p, rs in requests)


def cheaper_shared(groups: int, span: int, rows: int, width: int, pair_cost: float) -> bool:
    """Whether `groups` laid-out rows of `span` positions under a dense mask cost less than `rows` padded rows of
    `width`: each position's body, plus `pair_cost` for every query-key pair the mask covers."""
    return groups * (span + span * span * pair_cost) < rows * (width + width * width * pair_cost)


def shares(shape: ModelShape, prompt: int, responses: Sequence[int]) -> bool:
    """Whether one group is cheaper laid out shared than as rows (`prompt_sharing.share_batch`'s rule, for a
    micro-batch of this group alone)."""
    return cheaper_shared(1, prompt + sum(responses), len(responses), prompt + max(responses, default=0),
                          shape.pair_cost)


def rollout_flops(shape: ModelShape, requests: Sequence[tuple[int, Sequence[int]]], *, shared_prompt: bool) -> float:
    """The engine's work for `requests` of (prompt tokens, each sample's response tokens): the prompt's prefill
    (once a request when its samples share it through the prefix cache, else once a sample), then a decode step for
    each response token after the first (the prefill's last logits give the first)."""
    total = 0.0
    for prompt, responses in requests:
        total += shape.forward(prompt, head_positions=1) * (1 if shared_prompt else max(len(responses), 1))
        for r in responses:
            steps = max(r - 1, 0)
            # decode step j = 1..steps: one token through body and head, attending to the prompt + j positions
            total += steps * (2.0 * (shape.body_params + shape.head_params)) + \
                4.0 * shape.layers * shape.heads * shape.head_dim * (steps * prompt + steps * (steps + 1) / 2)
    return total
