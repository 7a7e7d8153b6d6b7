"""Reading one tensor-parallel rank's weights from a checkpoint's safetensors files, each tensor sliced lazily to
the box the rank holds; checkpoint tensors under other names (a renamed router, per-expert projections) are read
whole and stacked into the in-memory tensor the family names."""

from __future__ import annotations

from pathlib import Path

import torch

from rlinf_like.hybrid_engines.reshard.layout import TensorLayout
from rlinf_like.models.families import ModelConfig
from rlinf_like.models.families.config import check_checkpoint, stack_experts


def load_shards(path: str | Path, layouts: list[TensorLayout], rank: int, dtype: torch.dtype,
                cfg: ModelConfig | None = None) -> dict[str, torch.Tensor]:
    """Read this rank's slice of every weight from the checkpoint's safetensors files (lazily, per slice);
    with `cfg`, a checkpoint tensor the family does not map for it is refused by name first."""
    from safetensors import safe_open

    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    wanted = {layout.name: layout for layout in layouts}
    out: dict[str, torch.Tensor] = {}
    handles = [safe_open(str(file), framework="pt") for file in files]
    if cfg is not None:
        check_checkpoint(cfg, {n for f in handles for n in f.keys()}, f"native engine: {path}")
    # checkpoint tensors stored under another name (a renamed router, per-expert projections) -> in-memory name
    moved = {d: n for d, n in (cfg.checkpoint_weights() if cfg is not None else {}).items() if d != n}
    parts: dict[str, torch.Tensor] = {}
    for f in handles:
        with f:
            for name in f.keys():
                if name in wanted:
                    box = wanted[name].boxes[rank]
                    piece = f.get_slice(name)[tuple(slice(lo, hi) for lo, hi in box)]
                    # a fresh, resizable storage of our own (the reader's may be a view of the file)
                    out[name] = torch.empty(piece.shape, dtype=dtype).copy_(piece)
                elif moved.get(name) in wanted:  # replicated (the engine refuses tp > 1 for experts): whole
                    parts[name] = f.get_tensor(name).to(dtype)
    if moved:
        weights = dict(cfg.named_weights())
        for name in {n for n in moved.values() if n in wanted}:
            disk = cfg.disk_names(name, weights[name])
            if all(d in parts for d in disk):
                out[name] = stack_experts([parts.pop(d) for d in disk], cfg.num_experts) \
                    if weights[name].per_expert else parts.pop(disk[0])
    missing = sorted(set(wanted) - set(out))
    if missing:
        raise KeyError(f"checkpoint {path} lacks weights {missing[:5]}{'...' if len(missing) > 5 else ''}")
    return out
