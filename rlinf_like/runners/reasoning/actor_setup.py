"""The reasoning runner's actor section: which backend trains the policy (FSDP or Megatron), its
parallel sizes, and the checks that refuse by name what the Megatron path cannot do yet."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

from rlinf_like.hybrid_engines.fsdp import FSDPConfig
from rlinf_like.hybrid_engines.megatron import MegatronConfig
from rlinf_like.hybrid_engines.model_manager import OptimConfig
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.reasoning.worker_configs import loop_terms, loss_terms
from rlinf_like.training.loop import LoopConfig
from rlinf_like.utils.extras import require
from rlinf_like.workers.actor.backends import backend_class, backends_with
from rlinf_like.workers.actor.worker import ActorConfig, check_lora_support, check_share_support


def check_actor_section(cfg: ReasoningConfig) -> None:
    """The actor's backend and parallel sizes; what the Megatron path cannot do yet is refused by name."""
    act = cfg.actor
    backend = backend_class(act.backend)
    for key, capability in (("tp_size", "supports_tp"), ("pp_size", "supports_pp")):
        value = getattr(act, key)
        if value < 1 or (value > 1 and not getattr(backend, capability)):
            raise ValueError(f"actor.{key}={value} must be >= 1, and > 1 only with actor.backend="
                             f"{' or '.join(backends_with(capability))} (got actor.backend={act.backend!r})")
    if act.loop.pack_sequences and act.pp_size > 1:
        raise ValueError(f"actor.loop.pack_sequences=true needs actor.pp_size=1 with actor.backend={act.backend} "
                         f"(pipeline stages exchange fixed shapes), got actor.pp_size={act.pp_size}")
    check_lora_support(act.backend, act.lora)
    check_share_support(act.backend, act.loop)
    if cfg.algorithm.recompute_by_length and act.precision == "bf16":
        raise ValueError("algorithm.recompute_by_length=true reproduces the rollout's fp32 logprobs bit for bit and "
                         "needs actor.precision=fp32 (or auto), got actor.precision=bf16")
    if act.lora.enabled and cfg.algorithm.kl_beta > 0 and cfg.runner.sft_steps > 0:
        raise ValueError(f"actor.lora.rank={act.lora.rank} with algorithm.kl_beta > 0 takes the KL reference from the "
                         f"base model (adapters disabled), which an SFT warm-start would leave behind: set "
                         f"runner.sft_steps=0 (folding SFT adapters into the base is not supported yet)")
    if backend.requires and importlib.util.find_spec(backend.requires.split(".")[0]) is None:  # a look-up only
        require(backend.requires)  # raises naming the extra, before any worker starts


def reference_in_actor(cfg: ReasoningConfig) -> bool:
    """The KL reference comes from the actor itself (LoRA: the base with adapters disabled), not from a
    reference worker."""
    return cfg.algorithm.kl_beta > 0 and cfg.actor.lora.enabled


def actor_replicas(cfg: ReasoningConfig, ranks: int, component: str = "actor") -> int:
    """The data-parallel size on `ranks` ranks of the actor (or of the reference, which runs on the
    actor's backend): each replica spans actor.tp_size x actor.pp_size."""
    per_replica = cfg.actor.tp_size * cfg.actor.pp_size
    if ranks % per_replica:
        raise ValueError(f"actor.tp_size x actor.pp_size = {cfg.actor.tp_size} x {cfg.actor.pp_size} must divide "
                         f"the {component}'s {ranks} ranks (cluster.component_placement)")
    return ranks // per_replica


def actor_config(cfg: ReasoningConfig, model_path: str, micro_batch_tokens: int | None = None,
                 lean: bool = False) -> ActorConfig:
    """The actor's config: the backend `actor.backend` names, with the same optimizer either way;
    `micro_batch_tokens`: see `loop_terms`."""
    optim = OptimConfig(lr=cfg.algorithm.lr)
    megatron = MegatronConfig(tensor_parallel=cfg.actor.tp_size, pipeline_parallel=cfg.actor.pp_size, optim=optim,
                              # packed micro-batches run on the local layer spec (TE would need PackedSeqParams)
                              layer_spec="local" if cfg.actor.loop.pack_sequences else "auto")
    return ActorConfig(model_path=model_path, fsdp=FSDPConfig(optim=optim, lora=cfg.actor.lora,
                                                              precision=actor_precision(cfg),
                                                              lean=lean),
                       loss=cfg.actor.loss, loss_terms=loss_terms(cfg), loop=actor_loop(cfg),
                       loop_terms=loop_terms(cfg, micro_batch_tokens), backend=cfg.actor.backend,
                       megatron=megatron)


def actor_loop(cfg: ReasoningConfig) -> LoopConfig:
    """`actor.loop`, with `share_prompt: auto` off where no prompt has several samples (nothing to share); the
    worker decides the rest of auto by what its model supports."""
    loop = cfg.actor.loop
    if loop.share_prompt == "auto" and cfg.algorithm.samples_per_prompt == 1:
        return replace(loop, share_prompt="false")
    return loop


def actor_precision(cfg: ReasoningConfig) -> str:
    """What the actor's `auto` may choose: the bit-identical on-policy mode (recompute_by_length) is fp32 only."""
    return "fp32" if cfg.algorithm.recompute_by_length and cfg.actor.precision == "auto" else cfg.actor.precision
