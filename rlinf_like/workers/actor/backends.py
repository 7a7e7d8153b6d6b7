"""Training backends: `actor.backend` names a `TrainingBackend`, which builds the actor's ModelManager
and declares what it can do, so config checks read the declaration instead of comparing names.

A backend class is light (its manager's stack is imported in `build_manager`), so checks can read
every backend's declarations on a machine without its extra. To add a backend, subclass
`TrainingBackend`, declare its capabilities, and `@BACKEND_REGISTRY.register("name")` it.
"""

from __future__ import annotations

import torch

from rlinf_like.hybrid_engines.model_manager import ModelManager
from rlinf_like.utils.registry import Registry
from rlinf_like.workers.actor.config import ActorConfig


class TrainingBackend:
    supports_tp = False  # tensor parallelism inside a replica
    supports_pp = False  # pipeline parallelism inside a replica
    supports_lora = False  # LoRA adapters (actor.lora.rank > 0)
    supports_shared_prompts = False  # actor.loop.share_prompt (hybrid_engines/prompt_sharing.py)
    elastic = False  # trains data parallel over a changing set of ranks (the dynamic schedule's elastic actor)
    # the KL reference (an inference worker) is split over the actor's tensor / pipeline layout, not replicated
    reference_parallel = False
    cpu_precision: str | None = None  # the precision it trains in off a GPU when actor.precision=auto; None: hardware's
    extra: str | None = None  # the optional-dependency extra it needs installed
    requires: str | None = None  # the module of that extra, looked up in the driver before any worker starts

    @classmethod
    def check(cls, config: ActorConfig, owner: str) -> None:
        """What this backend cannot do with `config`, refused by key before the model is built."""

    @classmethod
    def build_manager(cls, config: ActorConfig) -> ModelManager:
        raise NotImplementedError


BACKEND_REGISTRY: Registry[type[TrainingBackend]] = Registry("training backend", key="actor.backend")


@BACKEND_REGISTRY.register("fsdp")
class FSDPBackend(TrainingBackend):
    elastic = True
    supports_lora = True
    supports_shared_prompts = True

    @classmethod
    def build_manager(cls, config: ActorConfig) -> ModelManager:
        from transformers import AutoModelForCausalLM

        from rlinf_like.hybrid_engines.fsdp import FSDPModelManager

        model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=torch.float32)
        return FSDPModelManager(model, config.fsdp)


@BACKEND_REGISTRY.register("megatron")
class MegatronBackend(TrainingBackend):
    supports_tp = True
    supports_pp = True
    reference_parallel = True
    cpu_precision = "fp32"  # megatron/manager.py: bf16 only on a GPU
    extra = "megatron"
    requires = "megatron.core"

    @classmethod
    def check(cls, config: ActorConfig, owner: str) -> None:
        m = config.megatron
        if config.loop.pack_sequences and m.pipeline_parallel > 1:
            raise ValueError(f"{owner}.loop.pack_sequences=true needs pipeline_parallel=1 under backend=megatron "
                             f"(pipeline stages exchange fixed shapes), got pipeline_parallel={m.pipeline_parallel}")
        if m.micro_batches > 1 and config.loop.max_tokens_per_micro_batch is not None:
            raise ValueError(f"{owner}.megatron.micro_batches={m.micro_batches} must divide every micro-batch's "
                             f"rows; token-budget micro-batches ({owner}.loop.max_tokens_per_micro_batch) vary: use 1")

    @classmethod
    def build_manager(cls, config: ActorConfig) -> ModelManager:
        from rlinf_like.hybrid_engines.megatron import MegatronModelManager  # raises naming [megatron] if missing

        return MegatronModelManager(config.model_path, config.megatron)


def backend_class(name: str) -> type[TrainingBackend]:
    """The backend `actor.backend=name` picks; an unknown name raises naming the key and the choices."""
    return BACKEND_REGISTRY.get(name)


def backends_with(capability: str) -> list[str]:
    """The registered backends declaring `capability` (e.g. "supports_pp"), for error messages."""
    return [name for name in BACKEND_REGISTRY.names() if getattr(backend_class(name), capability)]
