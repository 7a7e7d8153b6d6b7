"""The dynamic schedule's rollout side: replicas serving a step's requests onto a channel, handing their
devices to the actor as they finish, and (with `runner.migrate_at`) moving unfinished requests onto
fewer replicas. `DeviceScheduler` (device_handover.py) decides; this carries the decisions out."""

from __future__ import annotations

import time


from rlinf_like.runners.reasoning.worker_set import Workers
from rlinf_like.runtime import Channel, GroupResult
from rlinf_like.runners.reasoning.schedules.device_handover import DeviceScheduler
from rlinf_like.runtime.errors import ChannelTimeout
from rlinf_like.workers.rollout import RolloutRequest, RolloutResult, continuation

POLL_S = 0.02  # how long the driver waits on the result channel before checking replicas again
DRAIN_S = 120.0  # after an abort, how long a stopped replica's last results may take to arrive


class ElasticRollout:
    def __init__(self, w: Workers, units: list[list[int]], scheduler: DeviceScheduler, channel: Channel,
                 migrate_at: float):
        self.w, self.units, self.scheduler, self.channel, self.migrate_at = w, units, scheduler, channel, migrate_at
        self.serving: dict[int, GroupResult] = {}  # replica -> its serving call
        self.results: dict[str, RolloutResult] = {}  # request id -> its finished group
        self.partials: dict[str, RolloutResult] = {}  # request id -> what a stopped replica had of it
        self.requests: dict[str, RolloutRequest] = {}

    def serve(self, requests: list[RolloutRequest]) -> None:
        """A step's requests, dealt round-robin over the replicas."""
        self.results, self.partials = {}, {}
        self.requests = {q.request_id: q for q in requests}
        n = len(self.units)
        self.serving = {j: self._serve(j, requests[j::n]) for j in range(n)}

    def done(self, request_ids: list[str]) -> bool:
        return all(i in self.results for i in request_ids)

    def _serve(self, unit: int, requests: list[RolloutRequest]) -> GroupResult:
        return self.w.rollout.on_ranks(*self.units[unit]).serve_to(self.channel.name, requests)

    def _take(self, timeout: float) -> None:
        """Every result on the channel (waiting up to `timeout` for the first): complete or stopped part-way."""
        while True:
            try:
                result = self.channel.get(timeout=timeout)
            except ChannelTimeout:
                return
            (self.partials if result.partial else self.results)[result.request_id] = result
            timeout = 0.0

    def drain(self, ids: list[str]) -> None:
        """Wait until every request in `ids` has reported (the calls serving them have returned)."""
        deadline = time.monotonic() + DRAIN_S
        while missing := [i for i in ids if i not in self.results and i not in self.partials]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the rollout calls serving requests {missing[:5]} returned without reporting them")
            self._take(POLL_S)

    def _hand_over(self, unit: int) -> None:
        self.w.rollout.on_ranks(*self.units[unit]).offload().wait()
        self.scheduler.offload_sync(unit)

    def poll(self) -> None:
        """Take finished groups off the channel; offload a replica that has served all its requests."""
        self._take(POLL_S)
        for unit, handle in list(self.serving.items()):
            if handle.done():
                handle.wait()  # raises a replica's error, naming its rank
                self._hand_over(unit)
                del self.serving[unit]
                return  # one hand-over per poll: each replica's devices get their own scale-sync

    def migrate(self) -> None:
        """When enough of the step is done, move the unfinished requests onto fewer replicas and drain the rest."""
        plan = self.scheduler.plan_migration(len(self.results) / len(self.requests), list(self.serving),
                                             self.migrate_at)
        if plan is None:
            return
        kept, drained = plan
        units = kept + drained  # every serving unit
        stopping = [self.w.rollout.on_ranks(*self.units[u]).abort() for u in units]
        for call in stopping:
            call.wait()
        for unit in units:
            self.serving.pop(unit).wait()  # every result is on the channel once the call has returned
        open_ids = [i for i in self.requests if i not in self.results]
        self.drain(open_ids)
        moved = [continuation(self.requests[i], self.partials.pop(i)) for i in open_ids if i not in self.results]
        self.scheduler.migrate(drained, kept, len(moved))
        for unit in drained:
            self._hand_over(unit)
        for k, unit in enumerate(kept):
            self.serving[unit] = self._serve(unit, moved[k :: len(kept)])

    def finish(self) -> None:
        """Once every serving call has returned: all results are on the channel; none may be left part-done."""
        self.drain(list(self.requests))
        if self.partials:
            raise RuntimeError(f"requests {sorted(self.partials)[:5]} came back part-done with nothing to continue them")

    def scale(self, active: list[int]) -> list[int]:
        """scale-sync: onload and bring in the actor ranks the scheduler grants now."""
        granted, joining = self.scheduler.scale_sync()
        actor = self.w.actor
        if joining:
            actor.on_ranks(*joining).onload().wait()
            if active:  # the first ranks of a step already hold the state all ranks ended the last step with
                source = active[0]
                actor.on_ranks(source, *joining).join(source, joining).wait()
        return granted
