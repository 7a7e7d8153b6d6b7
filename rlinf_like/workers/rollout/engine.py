"""The rollout engine registry: `rollout.engine` names an engine class, and config checks read what
the class declares it can do (`RolloutEngine.supports_tp`, `continues_migrated`, `rescored_logprobs`,
`needs_gpu`).

The built-in engines are registered by import path, so listing them imports none: an engine's module
is imported when it is looked up, and its GPU stack (sglang) only when it is built. To add an engine,
subclass `RolloutEngine`, declare its capabilities on the class, and register it here by path (or
with `@ENGINE_REGISTRY.register("name")` on the class, from any module imported before the config
is checked).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch.distributed as dist

from rlinf_like.utils.registry import Registry
from rlinf_like.workers.rollout.base import (LOGPROB_SOURCES, ResultCallback, RolloutConfig, RolloutEngine,
                                            rollout_dtype)

log = logging.getLogger(__name__)

ENGINE_REGISTRY: Registry[type[RolloutEngine]] = Registry("rollout engine", key="rollout.engine")
ENGINE_REGISTRY.register("native", "rlinf_like.workers.rollout.engines.native.engine:NativeEngine")
ENGINE_REGISTRY.register("hf", "rlinf_like.workers.rollout.engines.hf_engine:HFEngine")
ENGINE_REGISTRY.register("sglang", "rlinf_like.workers.rollout.engines.sglang_engine:SGLangEngine")
ENGINE_REGISTRY.register("vllm", "rlinf_like.workers.rollout.engines.vllm_engine:VLLMEngine")

__all__ = ["ENGINE_REGISTRY", "LOGPROB_SOURCES", "ResultCallback", "RolloutConfig", "RolloutEngine",
           "check_rollout_config", "engine_class", "engine_names", "engines_with", "make_engine"]


def engine_class(name: str) -> type[RolloutEngine]:
    """The engine class `rollout.engine=name` picks (its module imported, not its GPU stack);
    an unknown name raises naming the key and the registered engines."""
    return ENGINE_REGISTRY.get(name)


def engine_names() -> list[str]:
    return ENGINE_REGISTRY.names()


def engines_with(capability: str) -> list[str]:
    """The registered engines declaring `capability` (e.g. "supports_tp"), for error messages."""
    return [name for name in engine_names() if getattr(engine_class(name), capability)]


def check_serves_continuously(config: RolloutConfig, needed_by: str) -> None:
    """What serving requests as they come needs (the async schedule, multi-turn rollouts): an engine declaring
    `serves_continuously`, and every rollout rank a replica of its own."""
    if not engine_class(config.engine).serves_continuously:
        raise ValueError(f"{needed_by} needs rollout.engine in {engines_with('serves_continuously')} (it serves "
                         f"requests as they come and takes weights between decode steps); got {config.engine!r}")
    if config.tp_size > 1:
        raise ValueError(f"{needed_by} needs rollout.tp_size=1 (every rollout rank serves on its own); "
                         f"got {config.tp_size}")


def check_returns_routes(name: str, key: str) -> None:
    """`key` (rollout.return_routes, or actor.routing_replay=R3, which sets it) needs an engine that keeps each token's
    mixture-of-experts routes."""
    if not engine_class(name).returns_routes:
        raise ValueError(f"{key}: rollout.engine={name!r} does not return mixture-of-experts routes; use "
                         f"rollout.engine in {engines_with('returns_routes')}")


def check_rollout_config(config: RolloutConfig, tp_size: int = 1) -> type[RolloutEngine]:
    """What the chosen engine cannot do, refused by key before it is built; returns its class.
    `tp_size`: ranks the engine would span (rollout.tp_size, resolved against the group)."""
    if config.logprobs not in LOGPROB_SOURCES:
        raise ValueError(f"rollout.logprobs={config.logprobs!r} is not one of {list(LOGPROB_SOURCES)}")
    engine = engine_class(config.engine)
    if config.logprobs == "rescored" and not engine.rescored_logprobs:
        able = engines_with("rescored_logprobs")
        raise ValueError(f"rollout.logprobs=rescored is built into the {' / '.join(able)} engine"
                         f"{'s' if len(able) > 1 else ''} only; rollout.engine={config.engine!r} reports the "
                         f"logprobs it sampled with")
    if config.return_routes:
        check_returns_routes(config.engine, "rollout.return_routes")
    if tp_size > 1 and not engine.supports_tp:
        raise ValueError(f"rollout.tp_size={tp_size}: rollout.engine={config.engine!r} runs on one rank; tensor "
                         f"parallelism needs rollout.engine in {engines_with('supports_tp')}")
    return engine


def make_engine(config: RolloutConfig, process_group=None, tokenizer=None, device: str = "cpu") -> RolloutEngine:
    """The engine `config.engine` names; `process_group` (world size > 1) makes it tensor parallel."""
    tp_size = dist.get_world_size(process_group) if process_group is not None else 1
    engine = check_rollout_config(config, tp_size)
    if config.dtype == "auto":  # every rank of a TP group resolves it alike: they run on one kind of host
        dtype, why = rollout_dtype(config.dtype, device)
        log.info(f"rollout dtype {dtype} ({why})")
        config = replace(config, dtype=dtype)
    return engine.create(config, process_group=process_group, tokenizer=tokenizer, device=device)
