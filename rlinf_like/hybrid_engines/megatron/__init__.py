"""Megatron-core backend (optional `[megatron]` extra, imported lazily: importing this package does
not import megatron; building a manager without megatron-core raises naming the extra)."""

from rlinf_like.hybrid_engines.megatron.manager import MegatronModelManager
from rlinf_like.hybrid_engines.megatron.types import MegatronConfig

__all__ = ["MegatronConfig", "MegatronModelManager"]
