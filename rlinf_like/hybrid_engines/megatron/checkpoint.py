"""Checkpoints of a MegatronModelManager: megatron's dist_checkpointing (reshardable) and HF export.

`save` writes the model's and the optimizer's sharded state dicts with megatron's `dist_checkpointing`
(each rank writes its shards) plus step and RNG states per rank, into `path.tmp`, then rank 0 swaps
the directory into place, so an interrupted save never destroys the previous checkpoint. `load` reads
them into this manager's layout, which may differ from the saver's (TP=2 -> PP=2, ...): megatron
reshards (not yet with the distributed optimizer, see _OPTIM_METADATA). RNG states come back only
when the world size matches. `export_hf` gathers the HF-named
shards to rank 0, which writes `config.json` + `model.safetensors`.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from rlinf_like.hybrid_engines.megatron import cpu_compat
from rlinf_like.hybrid_engines.model_manager import swap_checkpoint_into_place
from rlinf_like.hybrid_engines.megatron.types import MegatronState
from rlinf_like.hybrid_engines.reshard.layout import box_slices, dtype_from_name


# The distributed optimizer's state per data-parallel buffer ("dp_reshardable"): megatron 0.16's
# default form is refused by its own torch_dist backend here, and "fully_reshardable" fails to load
# torch AdamW's state. Known gap (megatron 0.16 with torch's AdamW, i.e. without TE / Apex): a
# distributed-optimizer checkpoint loads only into an optimizer that has stepped (a fresh one has no
# 'step' state for megatron to read) and into the same layout.
_OPTIM_METADATA = {"distrib_optim_sharding_type": "dp_reshardable"}


def _sharded_state(m: MegatronState, loading: bool) -> dict:
    model = m.gpt.sharded_state_dict()
    optim = m.optimizer.sharded_state_dict(model, is_loading=loading, metadata=_OPTIM_METADATA)
    return {"model": model, "optimizer": optim}


def save_checkpoint(m: MegatronState, path: str) -> None:
    from megatron.core import dist_checkpointing

    final, tmp = Path(path), Path(f"{path}.tmp")
    if m.rank == 0:
        if tmp.exists():
            shutil.rmtree(tmp)
        (tmp / "dist").mkdir(parents=True)
    dist.barrier()
    with cpu_compat.cuda_as_cpu():
        dist_checkpointing.save(_sharded_state(m, loading=False), str(tmp / "dist"))
    extra = {"step": m.step, "world_size": m.world_size, "base_lr": m.base_lr,
             "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}}
    torch.save(extra, tmp / f"extra_rank{m.rank}.pt")
    dist.barrier()
    if m.rank == 0:
        swap_checkpoint_into_place(tmp, final)
    dist.barrier()


def load_checkpoint(m: MegatronState, path: str) -> None:
    from megatron.core import dist_checkpointing

    with cpu_compat.cuda_as_cpu(), torch.no_grad():  # the optimizer writes into views of the parameters
        state = dist_checkpointing.load(_sharded_state(m, loading=True), str(Path(path) / "dist"))
        m.gpt.load_state_dict(state["model"])
        m.optimizer.load_state_dict(state["optimizer"])
    own = Path(path) / f"extra_rank{m.rank}.pt"
    extra = torch.load(own if own.exists() else Path(path) / "extra_rank0.pt", weights_only=False)
    m.step = extra["step"]
    m.set_base_lr(extra.get("base_lr", m.base_lr))  # as FSDP's scheduler state carries its base LRs
    # Adam's bias-correction step: the distributed optimizer's checkpoint formats do not carry torch
    # AdamW's per-parameter 'step'; it equals the manager's step (a skipped step never reaches Adam)
    for opt in getattr(m.optimizer, "chained_optimizers", [m.optimizer]):
        for state in opt.optimizer.state.values():
            if "step" in state:
                state["step"] = torch.full_like(state["step"], float(m.step))
    if extra["world_size"] == m.world_size:
        torch.set_rng_state(extra["rng"]["torch"])
        random.setstate(extra["rng"]["python"])
        np.random.set_state(extra["rng"]["numpy"])


def gather_hf(m: MegatronState) -> dict[str, torch.Tensor] | None:
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


def export_hf(m: MegatronState, path: str) -> None:
    from safetensors.torch import save_file

    full = gather_hf(m)
    if m.rank == 0:
        Path(path).mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in full.items()}, str(Path(path) / "model.safetensors"),
                  metadata={"format": "pt"})
        (Path(path) / "config.json").write_text(json.dumps(m.hf_config, indent=2))
    dist.barrier()
