"""Where a Megatron manager's HF weights come from: a transformers model or a checkpoint directory."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn


class _LazyWeights(Mapping):
    """An HF checkpoint directory's tensors, each read from its safetensors file when asked for: a rank
    reads only its stage's tensors, one at a time, never the whole checkpoint at once."""

    def __init__(self, path: Path):
        from safetensors import safe_open

        self.files: dict[str, Path] = {}
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                self.files.update(dict.fromkeys(f.keys(), file))
        if not self.files:
            raise FileNotFoundError(f"no *.safetensors in {path}")

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self.files:
            raise KeyError(f"HF checkpoint has no tensor {name!r}")
        with safe_open(str(self.files[name]), framework="pt") as f:
            return f.get_tensor(name)

    def __iter__(self):
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)


def hf_source(source: nn.Module | str | Path) -> tuple[dict, Mapping[str, torch.Tensor]]:
    """(config dict, tensors by name) of an HF causal LM or checkpoint directory."""
    if isinstance(source, nn.Module):
        return source.config.to_dict(), {k: v.detach() for k, v in source.state_dict().items()}
    path = Path(source)
    return json.loads((path / "config.json").read_text()), _LazyWeights(path)
