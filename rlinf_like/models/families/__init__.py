"""Model families: one description per decoder architecture, read by every backend (see base.py).

To add a family: one module here that registers a `ModelFamily`, imported below.
"""

from rlinf_like.models.families.base import MODEL_FAMILIES, FamilyRegistry, ModelFamily, Weight, family_of
from rlinf_like.models.families.config import ModelConfig
# registers them, in this order
from rlinf_like.models.families import llama, qwen2, qwen3, gemma3, qwen3_moe, mixtral  # noqa: F401,I001

__all__ = ["MODEL_FAMILIES", "FamilyRegistry", "ModelConfig", "ModelFamily", "Weight", "family_of"]
