"""The actor's config (a leaf module: the worker and the training backends both read it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_like.hybrid_engines.fsdp import FSDPConfig
from rlinf_like.hybrid_engines.megatron import MegatronConfig  # the config only: megatron is imported lazily
from rlinf_like.training.loop import LoopConfig, LoopTerms
from rlinf_like.workers.actor.loss import LossConfig, LossTerms


@dataclass(kw_only=True)
class ActorConfig:
    model_path: str = ""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    loss: LossConfig = field(default_factory=LossConfig)  # the config's actor.loss section, as written
    loss_terms: LossTerms = field(default_factory=LossTerms)  # what the run decides about the loss beyond it
    loop: LoopConfig = field(default_factory=LoopConfig)  # the config's actor.loop section, as written
    loop_terms: LoopTerms = field(default_factory=LoopTerms)  # what the run decides about the loop beyond it
    backend: str = "fsdp"  # a name in BACKEND_REGISTRY (workers/actor/backends.py): fsdp | megatron
    megatron: MegatronConfig = field(default_factory=MegatronConfig)  # backend=megatron: parallel sizes, optimizer
