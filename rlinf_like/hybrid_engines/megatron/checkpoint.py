"""Checkpoints of a MegatronModelManager: per-rank shards (same layout on load) and HF export.

`save` writes every rank's model shards, its optimizer's local state (the distributed optimizer's
shard included), step and RNG states to `path.tmp/rank{r}.pt`, then rank 0 swaps the directory into
place, so an interrupted save never destroys the previous checkpoint. `load` expects the same
TP/PP/DP layout (a `layout.json` records it and a mismatch is refused by name). `export_hf` gathers
the HF-named shards to rank 0, which writes `config.json` + `model.safetensors`.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.distributed as dist

from rlinf_like.hybrid_engines.reshard.layout import box_slices, dtype_from_name

if TYPE_CHECKING:
    from rlinf_like.hybrid_engines.megatron.manager import MegatronModelManager


def _layout(m: MegatronModelManager) -> dict:
    c = m.config
    return {"tensor_parallel": c.tensor_parallel, "pipeline_parallel": c.pipeline_parallel, "world_size": m.world_size}


def _torch_optimizers(m: MegatronModelManager) -> list[torch.optim.Optimizer]:
    return [o.optimizer for o in getattr(m.optimizer, "chained_optimizers", [m.optimizer])]


def save_checkpoint(m: MegatronModelManager, path: str) -> None:
    final, tmp = Path(path), Path(f"{path}.tmp")
    if m.rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        (tmp / "layout.json").write_text(json.dumps(_layout(m)))
    dist.barrier()
    state = {
        "model": {k: v for k, v in m.gpt.state_dict().items() if isinstance(v, torch.Tensor)},
        "optim": [o.state_dict() for o in _torch_optimizers(m)],
        "step": m.step,
        "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
    }
    torch.save(state, tmp / f"rank{m.rank}.pt")
    dist.barrier()
    if m.rank == 0:  # one complete checkpoint exists at every moment, under `path` or `path.old`
        old = Path(f"{path}.old")
        if old.exists():
            shutil.rmtree(old)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        if old.exists():
            shutil.rmtree(old)
    dist.barrier()


def load_checkpoint(m: MegatronModelManager, path: str) -> None:
    saved = json.loads((Path(path) / "layout.json").read_text())
    if saved != _layout(m):
        raise ValueError(f"checkpoint {path} was saved with layout {saved}; this manager runs {_layout(m)}")
    state = torch.load(Path(path) / f"rank{m.rank}.pt", weights_only=False)
    with torch.no_grad():
        own = m.gpt.state_dict()
        for name, value in state["model"].items():
            own[name].copy_(value)
    for opt, sd in zip(_torch_optimizers(m), state["optim"]):
        opt.load_state_dict(sd)
    m.step = state["step"]
    m._set_lr()
    torch.set_rng_state(state["rng"]["torch"])
    random.setstate(state["rng"]["python"])
    np.random.set_state(state["rng"]["numpy"])


def gather_hf(m: MegatronModelManager) -> dict[str, torch.Tensor] | None:
    """Full HF tensors on rank 0 (None elsewhere), assembled from every rank's boxes."""
    shards = {k: v.cpu() for k, v in m.named_shards().items()}
    gathered = [None] * m.world_size if m.rank == 0 else None
    dist.gather_object(shards, gathered, dst=0)
    if m.rank != 0:
        return None
    full = {}
    for layout in m.shard_layouts():
        t = torch.empty(layout.shape, dtype=dtype_from_name(layout.dtype))
        for rank, box in enumerate(layout.boxes):
            if layout.name in gathered[rank]:
                t[box_slices(box)] = gathered[rank][layout.name]
        full[layout.name] = t
    return full


def export_hf(m: MegatronModelManager, path: str) -> None:
    from safetensors.torch import save_file

    full = gather_hf(m)
    if m.rank == 0:
        Path(path).mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in full.items()}, str(Path(path) / "model.safetensors"),
                  metadata={"format": "pt"})
        (Path(path) / "config.json").write_text(json.dumps(m.hf_config, indent=2))
    dist.barrier()
