"""LoRA weight sync that sends adapters, not merged weights: the rollout merges them itself.

With LoRA the actor's base weights never change, so after one full round (the base weights and the adapters)
each later round sends only the adapters, A [r, in] and B [out, r] per adapted weight W [out, in]: for rank 16
on SmolLM2-135M's linear layers, ~3% of the model's bytes instead of ~79% for the merged weights. The rollout
keeps its own copy of each adapted base weight (the part its rank holds, in host memory) and serves

    W = W_base + (B @ A) * scaling

computed as peft's `merge_and_unload` computes it. Under tensor parallelism each rank receives just the
rows of B (a weight split by output rows) or the columns of A (split by input columns) that its part of W needs:
the adapter layouts are derived from W's own layout, so the generic reshard plan moves them like any tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_like.hybrid_engines.reshard.layout import TensorLayout

WEIGHT = ".weight"


@dataclass(frozen=True)
class AdapterSpec:
    """What the rollout needs to know of the actor's LoRA: rank, scaling (alpha / rank) and the adapted weights
    (base model names, e.g. `model.layers.0.self_attn.q_proj.weight`)."""

    rank: int
    scaling: float
    targets: tuple[str, ...]


def adapter_names(target: str) -> tuple[str, str]:
    """The synced names of a target's A and B (`...q_proj.weight` -> `...q_proj.lora_A.weight`, `lora_B`)."""
    module = target[: -len(WEIGHT)] if target.endswith(WEIGHT) else target
    return f"{module}.lora_A{WEIGHT}", f"{module}.lora_B{WEIGHT}"


def adapter_layouts(weight: TensorLayout, rank: int) -> tuple[TensorLayout, TensorLayout]:
    """A's and B's layouts for a weight laid out as `weight`: a rank holding rows o0:o1 and columns i0:i1 of W
    needs rows o0:o1 of B and columns i0:i1 of A."""
    out_dim, in_dim = weight.shape
    a_name, b_name = adapter_names(weight.name)
    a_boxes = tuple(((0, rank), box[1]) for box in weight.boxes)
    b_boxes = tuple((box[0], (0, rank)) for box in weight.boxes)
    return (TensorLayout(a_name, (rank, in_dim), a_boxes, weight.dtype),
            TensorLayout(b_name, (out_dim, rank), b_boxes, weight.dtype))


def with_adapters(layouts: list[TensorLayout], spec: AdapterSpec | None) -> list[TensorLayout]:
    """`layouts` plus the adapters of every target, laid out to match."""
    if spec is None:
        return layouts
    by_name = {layout.name: layout for layout in layouts}
    missing = sorted(set(spec.targets) - set(by_name))
    if missing:
        raise ValueError(f"LoRA targets {missing[:3]} are not among the rollout's weights")
    return layouts + [layout for t in spec.targets for layout in adapter_layouts(by_name[t], spec.rank)]


class AdapterMerger:
    """Rollout side: receive buffers for this rank's slice of every adapter, a copy of the base weights they
    adapt, and the merge into the served weights after each round."""

    def __init__(self, spec: AdapterSpec, weights: dict[str, torch.Tensor], layouts: list[TensorLayout], rank: int,
                 base: dict[str, torch.Tensor] | None = None):
        self.spec, self.weights = spec, weights
        by_name = {layout.name: layout for layout in layouts}
        self.buffers: dict[str, torch.Tensor] = {}
        for target in spec.targets:
            weight = weights[target]
            for layout in adapter_layouts(by_name[target], spec.rank):
                box = layout.boxes[rank]
                self.buffers[layout.name] = torch.zeros([hi - lo for lo, hi in box], dtype=weight.dtype,
                                                        device=weight.device)
        # on the host: on a GPU shared with the actor the copy must not hold device memory while the actor trains
        if base is not None:  # a copy kept elsewhere: engines serving one model share it
            self.base = base
            return
        self.base = {t: weights[t].detach().to("cpu", copy=True) for t in spec.targets}
        if any(w.is_cuda for w in weights.values()):
            self.base = {t: b.pin_memory() for t, b in self.base.items()}

    def after_round(self, full: bool) -> None:
        """A full round wrote the (unmerged) base weights into the served tensors: keep them as the base. Then
        serve base + (B @ A) * scaling."""
        with torch.no_grad():
            for target in self.spec.targets:
                served = self.weights[target]
                if full:
                    self.base[target].copy_(served)
                a_name, b_name = adapter_names(target)
                delta = self.buffers[b_name] @ self.buffers[a_name]
                served.copy_(self.base[target].to(served.device, non_blocking=True) + delta * self.spec.scaling)

