"""Megatron's parallel state over the worker group's default process group."""

from __future__ import annotations

import torch.distributed as dist

from rlinf_like.hybrid_engines.megatron import cpu_compat


def init_parallel(tp: int, pp: int, seed: int) -> None:
    """Initialize megatron's TP/PP/DP groups (DP = world / (tp * pp)) and its model-parallel RNG.
    A second manager in the same process with another layout first calls `destroy_parallel`."""
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    world = dist.get_world_size()
    if world % (tp * pp):
        raise ValueError(f"megatron manager: tensor_parallel={tp} x pipeline_parallel={pp} must divide the "
                         f"worker group's {world} ranks")
    cpu_compat.apply()
    if ps.model_parallel_is_initialized():
        have = (ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size())
        if have != (tp, pp):
            raise RuntimeError(f"megatron parallel state is already initialized with (tp, pp) = {have}; "
                               f"close() the previous manager first")
        return
    ps.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    model_parallel_cuda_manual_seed(seed)


def destroy_parallel() -> None:
    from megatron.core import parallel_state as ps

    ps.destroy_model_parallel()
