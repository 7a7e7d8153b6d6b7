"""Qwen2: the Llama decoder with q/k/v biases always (config.json's attention_bias does not say so) and no
bias on the attention output."""

from __future__ import annotations

from dataclasses import replace

from rlinf_like.models.families.base import MODEL_FAMILIES
from rlinf_like.models.families.llama import LLAMA

QWEN2 = MODEL_FAMILIES.register(replace(LLAMA, name="qwen2", model_types=("qwen2",), qkv_bias="always",
                                        o_bias="never"))
