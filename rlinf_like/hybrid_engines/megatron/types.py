"""Types the Megatron manager shares with its helpers (checkpoint.py): a leaf module, so the helpers
need not import the manager that imports them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch
from torch import nn

from rlinf_like.hybrid_engines.lr_schedule import SchedulerConfig
from rlinf_like.hybrid_engines.model_manager import OptimConfig
from rlinf_like.hybrid_engines.reshard.layout import TensorLayout


@dataclass
class MegatronConfig:
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    micro_batches: int = 1  # slices of each forward_backward batch (the pipeline's micro-batches)
    distributed_optimizer: bool = False
    precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto: bf16 on GPU, fp32 on CPU
    layer_spec: Literal["auto", "te", "local"] = "auto"  # auto: TransformerEngine when it imports
    seed: int = 1234
    optim: OptimConfig = field(default_factory=OptimConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)


class MegatronState(Protocol):
    """What checkpointing reads and restores of a MegatronModelManager."""

    gpt: nn.Module  # this rank's megatron GPTModel stage
    optimizer: Any  # megatron's (possibly chained) optimizer
    rank: int
    world_size: int
    step: int
    base_lr: float
    hf_config: dict

    def set_base_lr(self, lr: float) -> None: ...

    def named_shards(self) -> dict[str, torch.Tensor]: ...

    def shard_layouts(self) -> list[TensorLayout]: ...
