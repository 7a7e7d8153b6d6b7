"""Rank processes kept between worker groups (`cluster.reuse_workers`).

A Ray worker process spends most of its start-up importing torch and this package (~3 s of CPU each on a 2-core
host), before any work. A driver that launches many short-lived groups on one cluster (a test session, a sweep, a
server taking one job after another) pays that for every rank. With reuse on, a group's shutdown empties each rank's
process (`_WorkerHost.release`: process groups destroyed, environment, torch defaults and global seed restored) and
keeps it here, holding its share of its device; the next group launched on that device with that share takes it.
A process that cannot be emptied (a GPU rank, a thread or child process left running, no answer within
`RELEASE_TIMEOUT_S`) is ended, as without reuse.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import ray

log = logging.getLogger(__name__)
RELEASE_TIMEOUT_S = 10.0  # a rank still inside a call at shutdown is ended rather than waited for


@dataclass(frozen=True)
class HostKey:
    """What a kept process holds: its device's reservation and its share of it."""

    kind: str
    index: int
    share: float


class HostPool:
    def __init__(self) -> None:
        self._idle: dict[HostKey, list[ray.actor.ActorHandle]] = {}

    def take(self, key: HostKey) -> ray.actor.ActorHandle | None:
        """A kept process for `key`; None if there is none, after ending those kept on the same device with
        another share (they hold the device's resources the new process needs)."""
        if self._idle.get(key):
            return self._idle[key].pop()
        for other in [k for k in self._idle if (k.kind, k.index) == (key.kind, key.index)]:
            for handle in self._idle.pop(other):
                ray.kill(handle, no_restart=True)
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
            if why is None:
                self._idle.setdefault(key, []).append(handle)
            else:
                log.debug("worker process not kept for reuse: %s", why)
                ray.kill(handle, no_restart=True)

    def clear(self) -> None:
        for handles in self._idle.values():
            for handle in handles:
                ray.kill(handle, no_restart=True)
        self._idle.clear()
