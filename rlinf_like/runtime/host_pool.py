"""Rank processes kept between worker groups (`cluster.reuse_workers`).

A Ray worker process spends most of its start-up importing torch and this package (~3 s of CPU each on a 2-core
host), before any work. A driver that launches many short-lived groups on one cluster (a test session, a sweep, a
server taking one job after another) pays that for every rank. With reuse on, a group's shutdown empties each rank's
process (`_WorkerHost.release`: process groups destroyed, environment, torch defaults and global seed restored) and
keeps it here, in its device's reservation; the next group launched on that device takes it.
A process that cannot be emptied (a GPU rank, a thread or child process left running, no answer within
`RELEASE_TIMEOUT_S`) is ended, as without reuse.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import ray

log = logging.getLogger(__name__)
RELEASE_TIMEOUT_S = 10.0  # a rank still inside a call at shutdown is ended rather than waited for
# idle processes hold memory (0.34-0.65 GB each, measured in the suite): beyond this many on a device they are ended
MAX_KEPT_PER_DEVICE = 3


# What a CPU rank process asks Ray for inside its device's reservation (a bundle of one CPU). The placement, not Ray,
# divides a device between the ranks placed on it (`placement.py`: share = 1 / ranks on the device), and Ray holds an
# actor's resources for its life; so a process that asked for its rank's share could serve only ranks of that same
# share, and a test session's placements differ (a device to one rank, then to three). With one small fixed ask, any
# kept process on a device can take any rank placed there (up to 1 / CPU_HOST_ASK processes on a device, kept ones
# included). The reservation still keeps other runs off the device.
CPU_HOST_ASK = 0.01


@dataclass(frozen=True)
class HostKey:
    """What a kept process holds: a place in its device's reservation."""

    kind: str
    index: int


class HostPool:
    def __init__(self) -> None:
        self._idle: dict[HostKey, list[ray.actor.ActorHandle]] = {}
        self.taken = self.missed = 0  # kept processes handed out, and asks that found none (a new process starts)

    def take(self, key: HostKey) -> ray.actor.ActorHandle | None:
        """A kept process for `key`, or None if there is none."""
        if self._idle.get(key):
            self.taken += 1
            return self._idle[key].pop()
        self.missed += 1
        return None

    def give_back(self, hosts: list[tuple[HostKey, ray.actor.ActorHandle]]) -> None:
        """Empty these processes, all at once, and keep those that are as good as new; end the others."""
        refs = [handle.release.remote() for _, handle in hosts]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=RELEASE_TIMEOUT_S)
        done = set(ready)
        for ref, (key, handle) in zip(refs, hosts):
            why = "no answer within %gs" % RELEASE_TIMEOUT_S
            if ref in done:
                try:
                    why = ray.get(ref)
                except Exception as err:  # a dead or failed process is simply not kept
                    why = type(err).__name__
            if why is None and len(self._idle.setdefault(key, [])) >= MAX_KEPT_PER_DEVICE:
                why = f"{MAX_KEPT_PER_DEVICE} processes already kept on {key.kind} device {key.index}"
            if why is None:
                self._idle[key].append(handle)
            else:
                log.debug("worker process not kept for reuse: %s", why)
                ray.kill(handle, no_restart=True)

    def clear(self) -> None:
        for handles in self._idle.values():
            for handle in handles:
                ray.kill(handle, no_restart=True)
        self._idle.clear()
