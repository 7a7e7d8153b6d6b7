"""What the engines that run someone else's server share (SGLang, vLLM): the checkpoint's tensor shapes, whole
tensors staged in host memory for a weight sync to write into, the context length, and per-sample seeds."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from rlinf_like.workers.rollout.base import RolloutConfig, RolloutEngine
from rlinf_like.workers.rollout.types import RolloutRequest


def checkpoint_shapes(model_path: str) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of an HF safetensors checkpoint, read from the file headers only."""
    from safetensors import safe_open

    root = Path(model_path)
    index = root / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else \
        [p.name for p in sorted(root.glob("*.safetensors"))]
    shapes = {}
    for file in files:
        with safe_open(str(root / file), framework="pt") as f:
            for name in f.keys():
                if "rotary_emb.inv_freq" not in name:  # a buffer old checkpoints carry; no engine loads it
                    shapes[name] = tuple(f.get_slice(name).get_shape())
    return shapes


class StagedWeightsEngine(RolloutEngine):
    """An engine whose weights live inside another library: a sync writes whole tensors into a host staging
    copy (`weight_tensors`), and the subclass's `_weights_changed` hands them to the library."""

    def __init__(self, config: RolloutConfig):
        from transformers import AutoConfig

        super().__init__()
        self.config = config
        self.dtype = getattr(torch, config.dtype)
        self.max_context = config.max_context or AutoConfig.from_pretrained(config.model_path).max_position_embeddings
        self._rng = random.Random(config.seed)  # seeds for requests that bring none
        self._shapes = checkpoint_shapes(config.model_path)
        self._stage: dict[str, torch.Tensor] | None = None

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        if self._stage is None:  # allocated on first use: engines that never sync pay nothing
            self._stage = {name: torch.empty(shape, dtype=self.dtype) for name, shape in self._shapes.items()}
        return self._stage

    def _sample_seed(self, request: RolloutRequest, sample_index: int) -> int:
        """A seeded request's samples each get their own seed; an unseeded one draws from the engine's."""
        s = request.sampling
        return self._rng.getrandbits(62) if s.seed is None else (s.seed * 1_000_003 + sample_index) % (1 << 62)
