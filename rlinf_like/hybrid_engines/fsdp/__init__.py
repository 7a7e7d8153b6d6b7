from rlinf_like.hybrid_engines.fsdp.manager import FSDPConfig, FSDPModelManager

__all__ = ["FSDPConfig", "FSDPModelManager"]
