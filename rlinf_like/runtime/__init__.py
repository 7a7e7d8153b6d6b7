"""Worker system on Ray: Cluster, placement, Worker/WorkerGroup, typed Channel, process groups.

Knows nothing of RL; everything above builds on it.
"""

import importlib

# Loaded on first use (PEP 562): a Ray process that unpickles one class of this package, such as a channel's store
# (`channel_store.RemoteStore`), imports only that class's module, not torch and the rest.
_WHERE = {
    "channel": ["Channel"],
    "cluster": ["Cluster", "ClusterConfig", "NodeInfo", "devices_of"],
    "comm": ["PeerGroup"],
    "errors": ["ChannelClosed", "ChannelTimeout", "GroupTimeoutError", "PlacementError", "WorkerDiedError",
               "WorkerError"],
    "placement": ["Device", "Placement", "PlacementMode", "plan_placement"],
    "worker": ["Worker", "control"],
    "worker_group": ["GroupResult", "WorkerGroup", "connect_groups", "wait_all"],
}
_MODULE_OF = {name: module for module, names in _WHERE.items() for name in names}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_MODULE_OF))


__all__ = sorted(_MODULE_OF)
