"""Megatron-core backend (optional `[megatron]` extra, imported lazily: importing this package does
not import megatron; building a manager without megatron-core raises naming the extra)."""

from rlinf_like.hybrid_engines.megatron.manager import MegatronConfig, MegatronModelManager

__all__ = ["MegatronConfig", "MegatronModelManager"]
