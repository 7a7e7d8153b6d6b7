"""Tensor parallelism for the SGLang engine, through SGLang's own `tp_size`.

A replica of `rollout.tp_size` ranks is one `sglang.Engine(tp_size=tp)`: the replica's first rank starts it,
with CUDA_VISIBLE_DEVICES set to the GPUs of all the replica's ranks (each Ray rank sees only its own), so
SGLang's tp scheduler processes land on those GPUs (`base_gpu_id` 0, one GPU per TP rank). The other ranks
hold their GPUs for it and run an `SGLangFollower`: they serve nothing and receive no weights; the first rank
receives whole tensors and SGLang shards them itself when loading (`update_weights_from_tensor`). The leader /
follower pieces are shared with vLLM's TP (leader_tp.py); SGLang's names for them are kept here.

Kept free of sglang imports: `engine_kwargs` and `sglang_layouts` are plain functions (tested on CPU).
"""

from __future__ import annotations

from rlinf_like.workers.rollout.base import RolloutConfig
from rlinf_like.workers.rollout.engines.leader_tp import TPFollower, leader_layouts, replica_devices, visible_devices

# SGLang's names for the shared leader / follower pieces (leader_tp.py)
SGLangFollower = TPFollower
sglang_layouts = leader_layouts
__all__ = ["SGLangFollower", "engine_kwargs", "replica_devices", "sglang_layouts", "visible_devices"]


def engine_kwargs(config: RolloutConfig, tp_size: int | None = None, **extra) -> dict:
    """`sglang.Engine`'s keyword arguments. `tp_size`: GPUs the engine spans (the replica's ranks); None: the
    config's `rollout.tp_size` (0 counts as 1 here: a standalone engine). `extra` (e.g. attention_backend,
    enable_deterministic_inference) overrides."""
    kwargs = dict(model_path=config.model_path, tp_size=tp_size or config.tp_size or 1, dtype=config.dtype,
                  random_seed=config.seed, mem_fraction_static=config.sglang_mem_fraction,
                  base_gpu_id=0,  # of the GPUs this engine was given (`visible_devices`)
                  enable_memory_saver=True, enable_weights_cpu_backup=True)  # offload keeps weights on host
    if config.max_context:
        kwargs["context_length"] = config.max_context
    kwargs.update(extra)
    return kwargs
