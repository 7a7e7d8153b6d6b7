"""Tensor helpers shared by residency and resharding."""

import torch


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor that holds this rank's bytes: a DTensor's local shard, or the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t
