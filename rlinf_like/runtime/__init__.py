"""Worker system on Ray: Cluster, placement, Worker/WorkerGroup, typed Channel, process groups.

Knows nothing of RL; everything above builds on it.
"""

from rlinf_like.runtime.channel import Channel
from rlinf_like.runtime.cluster import Cluster, ClusterConfig, NodeInfo, devices_of
from rlinf_like.runtime.comm import PeerGroup
from rlinf_like.runtime.errors import (
    ChannelClosed,
    ChannelTimeout,
    GroupTimeoutError,
    PlacementError,
    WorkerDiedError,
    WorkerError,
)
from rlinf_like.runtime.placement import Device, Placement, PlacementMode, plan_placement
from rlinf_like.runtime.worker import Worker, control
from rlinf_like.runtime.worker_group import GroupResult, WorkerGroup, connect_groups, wait_all

__all__ = [
    "Channel", "ChannelClosed", "ChannelTimeout", "Cluster", "ClusterConfig", "Device", "devices_of", "GroupResult",
    "GroupTimeoutError", "NodeInfo", "PeerGroup", "Placement", "PlacementError", "PlacementMode", "Worker",
    "WorkerDiedError", "WorkerError", "WorkerGroup", "connect_groups", "control", "plan_placement", "wait_all",
]
