"""Resharding: move weights from the training layout to the inference layout, generically.

Each backend describes its tensors as `TensorLayout`s (which box of the global tensor every rank
holds); `plan_reshard` intersects source and target boxes and returns the `Transfer`s each target
rank needs; `bucketize` groups them for sending; `sync` moves them between worker groups with
versions (`WeightSender.publish` / `WeightReceiver.apply`). No per-model merge code, no "TP must divide".
"""

from rlinf_like.hybrid_engines.reshard.layout import (
    Box,
    TensorLayout,
    dtype_from_name,
    replicated,
    sharded,
    split_bounds,
)
from rlinf_like.hybrid_engines.reshard.sync import SyncPlan, WeightReceiver, WeightSender, dtensor_layout
from rlinf_like.hybrid_engines.reshard.transports import TRANSPORTS, WeightSyncError
from rlinf_like.hybrid_engines.reshard.planner import (
    NameMap,
    ReshardError,
    Transfer,
    apply_in_process,
    bucketize,
    plan_reshard,
)

__all__ = [
    "Box", "NameMap", "ReshardError", "TensorLayout", "Transfer", "apply_in_process", "bucketize",
    "dtype_from_name", "plan_reshard", "replicated", "sharded", "split_bounds",
    "SyncPlan", "TRANSPORTS", "WeightReceiver", "WeightSender", "WeightSyncError", "dtensor_layout",
]
