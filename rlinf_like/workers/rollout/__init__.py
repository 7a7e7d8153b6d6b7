"""Rollout: engines that turn prompts into sampled responses (native CPU engine, HF reference,
SGLang on GPU) behind one interface, and the worker that runs them in a group."""

from rlinf_like.workers.rollout.engine import (
    ENGINE_REGISTRY,
    RolloutConfig,
    RolloutEngine,
    check_rollout_config,
    engine_class,
    engine_names,
    make_engine,
)
from rlinf_like.workers.rollout.types import (
    FINISH_REASONS,
    RolloutRequest,
    RolloutResult,
    SampleProgress,
    SamplingParams,
    continuation,
)

__all__ = ["ENGINE_REGISTRY", "FINISH_REASONS", "RolloutConfig", "RolloutEngine", "RolloutRequest",
           "RolloutResult", "SampleProgress", "SamplingParams", "check_rollout_config", "continuation", "engine_class",
           "engine_names", "make_engine"]
