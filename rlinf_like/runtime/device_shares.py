"""Which worker groups hold which share of each CPU device of a Ray cluster; a rank that would overfill one is refused.

A CPU rank process asks Ray only for a small fixed amount inside its device's reservation (`host_pool.CPU_HOST_ASK`),
so that a kept process can serve a rank of any share. The shares the placement gave the ranks are counted here
instead: a group whose ranks do not fit beside the groups already running is refused at launch, by name, before any
process starts. (GPU ranks ask Ray for their share itself; Ray counts those.)
"""

from __future__ import annotations

import weakref
from collections import defaultdict

from rlinf_like.runtime.errors import PlacementError

_SLACK = 1e-9  # three ranks of share 1/3 fill a device


class DeviceShares:
    def __init__(self) -> None:
        # id(group) -> (the group, its name, device index -> share held)
        self._held: dict[int, tuple[weakref.ref, str, dict[int, float]]] = {}

    def claim(self, group, name: str, ranks) -> None:
        """Hold each CPU rank's share of its device for `group`, or raise PlacementError naming the device and the
        groups that fill it. A group that was dropped without a shutdown holds nothing."""
        self._held = {k: v for k, v in self._held.items() if v[0]() is not None}
        want: dict[int, float] = defaultdict(float)
        for rp in ranks:
            if rp.device.kind == "cpu":
                want[rp.device.index] += rp.share
        for index, share in want.items():
            holders = [(n, s[index]) for _, n, s in self._held.values() if index in s]
            if share + sum(s for _, s in holders) > 1 + _SLACK:
                held = ", ".join(f"{n!r} {s:.3g}" for n, s in holders)
                raise PlacementError(
                    f"worker group {name!r} needs {share:.3g} of cpu device {index}, but running groups hold "
                    f"{held} of it: shut them down first, or plan both in one placement (cluster.place) so that "
                    f"they share the device")
        if want:
            self._held[id(group)] = (weakref.ref(group), name, dict(want))

    def free(self, group) -> None:
        self._held.pop(id(group), None)
