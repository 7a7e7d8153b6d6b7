"""Hybrid engines: model managers that train and hand their device memory back and forth.

`model_manager.py` is the interface; `fsdp/` (FSDP2) and `megatron/` (megatron-core, imported lazily)
implement it; `residency.py` offloads / onloads params, grads and optimizer state; `reshard/` moves
trained weights into the rollout's layout.
"""

from rlinf_like.hybrid_engines.residency import PARTS, MoveStats, ResidencyManager

__all__ = ["PARTS", "MoveStats", "ResidencyManager"]
