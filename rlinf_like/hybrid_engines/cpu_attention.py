"""Training attention on CPU under bf16 autocast: short sequences run SDPA in float32.

PyTorch's CPU flash-attention backward in bf16 pays a fixed cost per (row, head) that dwarfs the arithmetic at the
lengths RL batches have. Measured on an Intel Xeon with AMX (torch 2.13, one thread, SmolLM2's 9 query / 3 key-value
heads of 64), forward + backward, causal:

| rows x length | bf16 | float32 (inputs cast up, output down) |
|---|---|---|
| 16 x 16 | 14.3 ms | 1.3 ms |
| 6 x 72 | 28.2 ms | 9.0 ms |
| 2 x 200 | 18.5 ms | 12.0 ms |
| 1 x 432 | 23.1 ms | 21.5 ms |
| 1 x 1024 | 67.5 ms | 94.1 ms |

So below `FP32_BELOW` keys a training forward (one that records a graph) casts query, key and value to float32 for
the attention alone; longer sequences, inference and every other device keep transformers' SDPA as it is. float32
attention is also the more exact of the two: the change moves bf16 runs' bits, never fp32 runs' (the golden runs).
"""

from __future__ import annotations

import os

import torch

# key length up to which float32 wins (the crossover above lies between 432 and 512 keys); the environment variable
# moves it for another host's crossover, and 0 turns the routing off (bench/cpu_attention.py compares the two)
FP32_BELOW = int(os.environ.get("RLINF_ATTENTION_FP32_BELOW", "448"))


def _wrap(sdpa):
    def sdpa_forward(module, query, key, value, attention_mask, *args, **kwargs):
        if (query.device.type != "cpu" or query.dtype != torch.bfloat16 or not torch.is_grad_enabled()
                or not query.requires_grad or key.shape[-2] >= FP32_BELOW):
            return sdpa(module, query, key, value, attention_mask, *args, **kwargs)
        if attention_mask is not None and attention_mask.is_floating_point():
            attention_mask = attention_mask.float()
        with torch.autocast("cpu", enabled=False):  # autocast would cast SDPA's inputs back to bf16
            out, weights = sdpa(module, query.float(), key.float(), value.float(), attention_mask, *args, **kwargs)
        return out.to(query.dtype), weights

    sdpa_forward.wrapped = sdpa
    return sdpa_forward


def install() -> None:
    """Route transformers' "sdpa" attention through the float32 choice above, once per process. Process-wide on
    purpose: every HF model a trainer builds reads the same registry, and the wrapper changes nothing for inference
    or off CPU."""
    from transformers.modeling_utils import AttentionInterface

    current = AttentionInterface._global_mapping["sdpa"]
    if not hasattr(current, "wrapped"):  # the registry itself says whether this process installed it
        AttentionInterface.register("sdpa", _wrap(current))
