"""Routing replay for mixture-of-experts training (R2 and R3: "Stabilizing MoE RL by Aligning Training and
Inference Routers", arXiv 2510.11370).

A MoE layer's router picks each token's top-k experts from its logits. The rollout engine and the trainer compute
those logits in different kernels (and often dtypes), so near ties fall differently and the trainer runs experts the
sample never went through: the train/rollout mismatch grows, and GRPO on MoE models is seen to collapse. With
replay the trainer forward uses the experts the rollout engine chose (`batch["routes"]`, [rows, tokens, MoE layers,
k], aligned with `input_ids`): R3 takes them from the rollout engine; R2 from the trainer's own first forward over
the batch (the recomputation of pi_old, `recorded_routes`), so that the later mini-batches and epochs, whose weights
have moved, still run the experts pi_old ran. R2 needs no engine that returns routes; R3 also removes the engine's
disagreement. The weights of those experts still come from the trainer's own router logits (the
softmax gathered at the forced experts, renormalised as the family renormalises), so the router keeps its gradient.

The routers of an HF model (transformers' Qwen3-MoE and Mixtral `mlp.gate` modules) are patched once, on the
instance; a patched router with no routes set computes exactly what transformers computes. The routes stay set until
the next call of `prepare`, so activation checkpointing, which runs the forward again in backward, replays the
same experts. Every forward records the trainer's own top-k, from which `agreement` reads the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

REPLAY_MODES = ("disabled", "R2", "R3")


@dataclass
class _State:
    replay: bool  # force the routes a batch carries (R3); else only record the trainer's own, for the metrics
    renormalise: bool
    scores_in_float: bool  # the chosen experts' weights stay float32 (Mixtral), else cast to the logits' dtype
    top_k: int
    layers: int  # MoE layers (patched routers)
    forced: torch.Tensor | None = None  # [tokens, MoE layers, k] in the model's flattened token order
    own: dict[int, torch.Tensor] = field(default_factory=dict)  # per MoE layer, the trainer's own top-k


def routers(model: nn.Module) -> list[nn.Module]:
    """The model's MoE routers in layer order: every `mlp.gate` module whose MLP holds `experts`."""
    out = []
    for name, module in model.named_modules():
        if name.endswith("mlp.gate") and hasattr(model.get_submodule(name.rsplit(".", 1)[0]), "experts"):
            out.append(module)
    return out


def install(model: nn.Module, replay: bool) -> None:
    """Patch the model's routers (once): `replay` forces the routes of the batches `token_stats` runs (R3); else
    they only record the trainer's own routes, which `agreement` compares with the rollout's."""
    _state(model, replay).replay = replay


def installed(model: nn.Module) -> bool:
    return getattr(model, "_route_replay", None) is not None


def _state(model: nn.Module, replay: bool = False) -> _State:
    """The replay state of `model`, patching its routers at the first call."""
    state = getattr(model, "_route_replay", None)
    if state is not None:
        return state
    from rlinf_like.models.families import ModelConfig

    config, found = getattr(model, "config", None), routers(model)
    if config is None or not found:
        raise ValueError("actor.routing_replay needs a mixture-of-experts HF model (qwen3_moe, mixtral); this model "
                         f"has no routers ({type(model).__name__})")
    cfg = ModelConfig.from_hf(config.to_dict(), "actor.routing_replay")
    state = _State(replay=replay, renormalise=cfg.norm_topk_prob,
                   scores_in_float=cfg.family.router_weights_dtype == "float32",
                   top_k=cfg.experts_per_token, layers=len(found))
    for layer, router in enumerate(found):
        router.forward = _replaying_forward(router, layer, state)
    object.__setattr__(model, "_route_replay", state)  # not a submodule or buffer: no state_dict entry
    return state


def _replaying_forward(router: nn.Module, layer: int, state: _State):
    def forward(hidden_states: torch.Tensor):
        hidden = hidden_states.reshape(-1, router.weight.shape[1])
        logits = F.linear(hidden, router.weight)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float)
        top, chosen = torch.topk(probs, state.top_k, dim=-1)
        state.own[layer] = chosen.detach()
        if state.forced is not None:
            if state.forced.shape[0] != hidden.shape[0]:
                raise ValueError(f"routing replay: {state.forced.shape[0]} tokens of routes for a forward over "
                                 f"{hidden.shape[0]}")
            chosen = state.forced[:, layer].to(device=probs.device, dtype=torch.long)
            top = probs.gather(-1, chosen)
        if state.renormalise:
            top = top / top.sum(dim=-1, keepdim=True)
        return logits, (top if state.scores_in_float else top.to(logits.dtype)), chosen

    return forward


def flat_routes(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's routes in the order the model flattens its tokens (the padded rows, or the packed ones), and
    which of those are routes the rollout ran ([tokens] bool: not padding, nor a sequence's last token)."""
    routes = batch["routes"]
    packing = batch.get("packing")
    b, t = routes.shape[:2]
    flat = routes.reshape(b * t, *routes.shape[2:])
    mask = batch.get("attention_mask")
    real = torch.ones(b, t, dtype=torch.bool) if mask is None else mask.bool().cpu()
    # a sequence's last token ran through no rollout pass (its route is a placeholder): not a real route
    valid = (real & torch.cat([real[:, 1:], torch.zeros(b, 1, dtype=torch.bool)], 1)).reshape(-1).to(flat.device)
    if packing is None:
        return flat, valid
    packing = packing.to(flat.device)
    return packing.pack(routes).reshape(-1, *routes.shape[2:]), packing.pack(valid.view(b, t)).reshape(-1)


def recorded_routes(model: nn.Module, batch: dict) -> torch.Tensor:
    """The routes the trainer's own routers chose in the last forward, over `batch` as it ran (padded rows or
    packed), laid out as a batch carries them: [rows, tokens, MoE layers, k] uint8, aligned with `input_ids`
    (padding 0). R2 records them in the recomputation of pi_old and replays them in every later forward."""
    state = _state(model)
    if len(state.own) != state.layers:
        raise RuntimeError(f"routing replay: the last forward recorded {len(state.own)} of {state.layers} MoE layers")
    own = torch.stack([state.own[i] for i in range(state.layers)], dim=1)  # [tokens as they ran, L, k]
    packing = batch.get("packing")
    if packing is not None:
        rows, width = packing.input_ids.shape
        own = packing.to(own.device).unpack(own.view(rows, width, *own.shape[1:]))
    return own.reshape(*batch["input_ids"].shape, *own.shape[-2:]).to("cpu", torch.uint8)


def prepare(model: nn.Module, batch: dict) -> None:
    """Before a forward over `batch` of a model with patched routers: force the batch's routes when replaying, else
    (or when the batch has none) let the routers choose."""
    state = _state(model)
    routes = flat_routes(batch)[0] if state.replay and "routes" in batch else None
    if routes is not None and routes.shape[1] != state.layers:
        raise ValueError(f"routing replay: routes for {routes.shape[1]} MoE layers, the model has {state.layers}")
    state.forced = routes
    state.own.clear()


def agreement(model: nn.Module, batch: dict) -> dict[str, float]:
    """How the trainer's own routers agreed with the batch's routes over its real tokens in the last forward:
    `moe/router_agreement`, the share of (token, layer) pairs choosing the same set of experts, and
    `moe/tokens_all_layers_equal`, the share of tokens that agree in every MoE layer."""
    state = _state(model)
    if "routes" not in batch or not state.own:
        return {}
    routes, valid = flat_routes(batch)
    if not bool(valid.any()):
        return {}
    own = torch.stack([state.own[i] for i in sorted(state.own)], dim=1)  # [tokens, layers, k]
    same = (own.sort(-1).values == routes.to(own.device, torch.long).sort(-1).values).all(-1)[valid.to(own.device)]
    return {"moe/router_agreement": float(same.double().mean()),
            "moe/tokens_all_layers_equal": float(same.all(-1).double().mean())}
