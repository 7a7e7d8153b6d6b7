"""Hybrid engines: model managers that train and hand their device memory back and forth.

Built so far: residency (offload / onload of params, grads, optimizer state).
"""

from rlinf_like.hybrid_engines.residency import PARTS, MoveStats, ResidencyManager

__all__ = ["PARTS", "MoveStats", "ResidencyManager"]
