"""The driver's side of the asynchronous schedule: which prompt groups start, which a step trains on, which
are too stale. The rollout replicas serve continuously (`RolloutWorker.serve`); this class hands them groups
and collects the finished ones from a channel.

Groups are numbered 0, 1, 2, ...: group g is prompt g % B of the draw for step g // B (B = prompts_per_step),
so the data order depends on the group number alone and survives a resume. `runner.stale_policy`:

* `wait`: step s trains on exactly the groups of draw s, and draw s starts only once the trainer has done
  s - k steps (k = runner.max_staleness). No group is ever more than k versions behind; the rollout pauses
  admission while it is k steps ahead. With k = 0 this is the synchronous schedule.
* `drop`: at most (k + 1) * B groups are out (generating or waiting); a step trains on the first B to finish,
  whichever draw they are from. A group whose oldest token is more than k versions behind is dropped
  (counted), and a new group starts in its place.

Each take writes down the request ids it trained on and the ones it dropped (`GroupStream.ledger`, saved with the
stream in each checkpoint). A run that resumes, by hand or after a dead worker, continues the committed ledger, so
`account` can show that every group was trained on at most once and none went missing, by request id. The samples
themselves are not replayed bit for bit: the replicas serve ahead of the trainer and take new weights between decode
steps, so a group generated again after a restart meets the weight changes at other tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field


from rlinf_like.data.tasks import Problem
from rlinf_like.runners.reasoning.phases import request_id
from rlinf_like.runtime import Channel, GroupResult, WorkerGroup
from rlinf_like.runtime.errors import ChannelTimeout
from rlinf_like.workers.rollout import RolloutRequest, RolloutResult

STALE_POLICIES = ("drop", "wait")
TRAIN, EVAL = "train", "eval"  # the channel keys of training groups and evaluation requests
POLL_S = 2.0  # how often a waiting driver checks that the serve loops are alive


def may_start(policy: str, group: int, steps_done: int, outstanding: int, per_step: int, max_staleness: int) -> bool:
    """Whether group `group` may start now, with `outstanding` groups out (generating or finished, not yet
    trained on) and the trainer `steps_done` steps in."""
    if policy == "wait":
        return group // per_step <= steps_done + max_staleness
    return outstanding < (max_staleness + 1) * per_step


def receive(channel: Channel, key: str, serving: GroupResult | None, timeout: float | None = None) -> RolloutResult | None:
    """The next result under `key` (None if `timeout` seconds pass first). While waiting, checks that the rollout's
    serve loops still run: a replica that died or raised surfaces as its error, naming it, instead of a hang."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = POLL_S if deadline is None else min(POLL_S, max(deadline - time.monotonic(), 0.0))
        try:
            return channel.get(key=key, timeout=wait)
        except ChannelTimeout:
            if serving is not None and serving.any_done():
                serving.wait()  # raises the replica's error
                raise RuntimeError(f"the rollout's serve loop ended while the driver waited for {key!r} results")
            if deadline is not None and time.monotonic() >= deadline:
                return None


def submit_round_robin(rollout: WorkerGroup, requests: list[RolloutRequest], numbers: list[int], key: str) -> None:
    """Hand request i to replica numbers[i] % replicas, one `submit` call per replica, and wait until all are
    queued (the serve loops take them from there)."""
    by_replica: dict[int, list[RolloutRequest]] = {}
    for request, n in zip(requests, numbers, strict=True):
        by_replica.setdefault(n % rollout.world_size, []).append(request)
    for call in [rollout.on_ranks(r).submit(reqs, key) for r, reqs in by_replica.items()]:
        call.wait()


def staleness(result: RolloutResult, version: int) -> int:
    """How many versions the oldest token of a group is behind the trainer's `version`."""
    return version - result.oldest_version()


@dataclass
class Taken:
    """What one step trains on, in group order, and what it cost to get it."""

    results: list[RolloutResult]
    problems: list[Problem]
    dropped: int  # groups dropped as too stale while collecting these
    wait_s: float  # the trainer's wait for them
    scoring: list[GroupResult | None]  # per group, its reward call when it was started on arrival (`scorer`)
    served_tokens: int = 0  # response tokens of every group that arrived since the previous take (kept or not)
    served_s: float = 0.0  # wall seconds since the previous take
    queued_s: list[float] = field(default_factory=list)  # per taken group, finished -> taken
    latency_s: list[float] = field(default_factory=list)  # per taken group submitted in this attempt, submit -> finish


class GroupStream:
    def __init__(self, *, rollout: WorkerGroup, channel: Channel, draw: Callable[[int], tuple[list, list]],
                 per_step: int, max_staleness: int, policy: str, serving: GroupResult | None = None,
                 scorer: Callable[[list[RolloutResult], list[Problem]], GroupResult] | None = None):
        """`draw(step)` gives step `step`'s (requests, problems); `serving` is the rollout's running serve call;
        `scorer`, when given, starts a group's reward call as the group arrives (`pump` lets groups arrive while
        the trainer works, so scoring leaves the step's critical path)."""
        self.rollout, self.channel, self.draw, self.serving, self.scorer = rollout, channel, draw, serving, scorer
        self.scoring: dict[int, GroupResult] = {}  # group -> its reward call, started on arrival
        self.per_step, self.max_staleness, self.policy = per_step, max_staleness, policy
        self.next_group = 0
        self.out: dict[str, int] = {}  # request id -> group, for groups submitted and not yet trained on
        self.finished: dict[int, RolloutResult] = {}  # group -> its result, arrived and not yet trained on
        self._draws: dict[int, tuple[list, list]] = {}
        self.ledger: list[dict] = []  # per take: {"step", "trained": [request ids], "dropped": [request ids]}
        # for the serve metrics: when groups went out and came back, and the tokens served since the last take
        self.submitted_at: dict[int, float] = {}
        self.arrived_at: dict[int, float] = {}
        self.served_tokens, self.last_take = 0, time.perf_counter()

    # --- groups ------------------------------------------------------------------------------------------
    def _group(self, group: int) -> tuple[RolloutRequest, Problem]:
        step, i = divmod(group, self.per_step)
        if step not in self._draws:
            self._draws = {s: d for s, d in self._draws.items() if s >= step - 1}  # old draws are done with
            self._draws[step] = self.draw(step)
        requests, problems = self._draws[step]
        return requests[i], problems[i]

    def _submit(self, groups: list[int]) -> None:
        requests = [self._group(g)[0] for g in groups]
        self.out.update({request.request_id: g for request, g in zip(requests, groups)})
        self.submitted_at.update(dict.fromkeys(groups, time.perf_counter()))
        submit_round_robin(self.rollout, requests, groups, TRAIN)

    def top_up(self, steps_done: int) -> None:
        """Start every group the policy allows with the trainer `steps_done` steps in."""
        start = []
        while may_start(self.policy, self.next_group, steps_done, len(self.out) + len(start), self.per_step,
                        self.max_staleness):
            start.append(self.next_group)
            self.next_group += 1
        if start:
            self._submit(start)

    def _receive(self, timeout: float | None = None) -> bool:
        """Take the next finished group (False if none came within `timeout`)."""
        result = receive(self.channel, TRAIN, self.serving, timeout)
        if result is None:
            return False
        group = self.out.get(result.request_id)
        if group is not None:  # groups aborted at a shutdown or resubmitted after a resume are not ours
            self.finished[group] = result
            self.arrived_at[group] = time.perf_counter()
            self.served_tokens += sum(len(ids) for ids in result.response_ids)
            if self.scorer is not None:
                self.scoring[group] = self.scorer([result], [self._group(group)[1]])
        return True

    def pump(self, seconds: float) -> None:
        """Take the groups that finish within `seconds` (the driver calls it while the trainer works)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and self._receive(timeout=left):
            pass

    def take(self, step: int, version: int) -> Taken:
        """The groups step `step` trains on, the trainer holding weights `version` (blocks until they are in)."""
        start, dropped = time.perf_counter(), []
        if self.policy == "wait":  # exactly that step's draw, in order
            chosen = list(range(step * self.per_step, (step + 1) * self.per_step))
            while any(g not in self.finished for g in chosen):
                self._receive()
        else:  # the first to finish that are fresh enough
            chosen = []
            while len(chosen) < self.per_step:
                waiting = [g for g in self.finished if g not in chosen]  # arrival order
                if not waiting:
                    self._receive()
                    continue
                if staleness(self.finished[waiting[0]], version) > self.max_staleness:
                    dropped.append(self.finished.pop(waiting[0]).request_id)
                    self.out.pop(dropped[-1])
                    for kept in (self.scoring, self.submitted_at, self.arrived_at):
                        kept.pop(waiting[0], None)
                    self.top_up(step)  # a fresh group in its place
                    continue
                chosen.append(waiting[0])
        results = [self.finished.pop(g) for g in chosen]
        for result in results:
            del self.out[result.request_id]
        now = time.perf_counter()
        arrived = [self.arrived_at.pop(g, now) for g in chosen]  # restored groups arrived before this attempt
        submitted = [self.submitted_at.pop(g, None) for g in chosen]
        self.ledger.append({"step": step, "trained": [r.request_id for r in results], "dropped": dropped})
        taken = Taken(results=results, problems=[self._group(g)[1] for g in chosen], dropped=len(dropped),
                      wait_s=now - start, scoring=[self.scoring.pop(g, None) for g in chosen],
                      served_tokens=self.served_tokens, served_s=now - self.last_take,
                      queued_s=[now - a for a in arrived],
                      latency_s=[a - s for a, s in zip(arrived, submitted, strict=True) if s is not None])
        self.served_tokens, self.last_take = 0, now
        return taken

    # --- checkpoints -------------------------------------------------------------------------------------
    def state(self) -> dict:
        """Finished groups are saved whole; groups still generating are saved by number and start again on
        resume (under the checkpoint's weights). No finished sample is lost."""
        return {"next_group": self.next_group,
                "generating": sorted(g for g in self.out.values() if g not in self.finished),
                "finished": {str(g): asdict(r) for g, r in self.finished.items()},
                "ledger": [dict(entry) for entry in self.ledger]}

    def restore(self, state: dict) -> None:
        self.next_group = state["next_group"]
        self.ledger = [dict(entry) for entry in state.get("ledger", [])]
        for g, result in state["finished"].items():
            self.finished[int(g)] = RolloutResult(**result)
            self.out[result["request_id"]] = int(g)
        if state["generating"]:
            self._submit(state["generating"])


@dataclass(frozen=True)
class Account:
    """What a run's ledger says about its samples, by request id."""

    trained: int  # groups trained on
    dropped: int  # groups dropped as too stale (never trained on)
    twice: list[str]  # request ids trained on more than once, or both trained on and dropped
    missing: list[str]  # under `wait`: request ids of the steps' draws that were not trained on
    steps: list[int]  # the steps the ledger holds, in order: 0..n-1 once each for a run that lost no step

    def __str__(self) -> str:
        verdict = ("each once, none missing" if self.complete
                   else f"counted twice: {self.twice[:5]}, missing: {self.missing[:5]}, steps {self.steps}")
        return f"{self.trained} groups trained on and {self.dropped} dropped, by request id: {verdict}"

    @property
    def complete(self) -> bool:
        return not (self.twice or self.missing) and self.steps == list(range(len(self.steps)))


def account(ledger: list[dict], per_step: int, policy: str) -> Account:
    """Check a ledger: one entry per step, no request id trained on twice (or trained on and dropped), and, under
    `wait`, every group of each step's draw trained on (under `drop` a group may still be out when the run ends, so
    only duplicates are errors there)."""

    trained = [rid for entry in ledger for rid in entry["trained"]]
    dropped = [rid for entry in ledger for rid in entry["dropped"]]
    seen: dict[str, int] = {}
    for rid in trained + dropped:
        seen[rid] = seen.get(rid, 0) + 1
    missing = []
    if policy == "wait":
        expected = [request_id(entry["step"], i) for entry in ledger for i in range(per_step)]
        missing = [rid for rid in expected if rid not in seen]
    return Account(trained=len(trained), dropped=len(dropped), twice=sorted(r for r, n in seen.items() if n > 1),
                   missing=missing, steps=[entry["step"] for entry in ledger])


def staleness_metrics(taken: Taken, version: int) -> dict[str, float]:
    """Per step: how far behind the trained groups were (their oldest token), the share of tokens made by older
    weights, the groups whose samples span a weight change (partial rollouts), and the groups dropped."""
    behind = [staleness(r, version) for r in taken.results]
    tokens = [version - v for r in taken.results for versions in r.token_versions for v in versions]
    return {"staleness_min": float(min(behind)), "staleness_mean": sum(behind) / len(behind),
            "staleness_max": float(max(behind)), "dropped_groups": float(taken.dropped),
            "stale_token_fraction": sum(t > 0 for t in tokens) / max(len(tokens), 1),
            "partial_groups": float(sum(len({v for vs in r.token_versions for v in vs}) > 1 for r in taken.results))}


def serve_metrics(taken: Taken) -> dict[str, float]:
    """Per step, what the continuously serving rollout did: tokens served per wall second since the previous
    step (every group that arrived, trained on or dropped), how long the trainer waited for groups, how long the
    taken groups had waited finished, and their submit -> finish latency. A step boundary means nothing to the
    serve loops, so the synchronous schedules' `rollout_s` is not reported."""
    latency = taken.latency_s or [0.0]
    return {"serve_tokens_per_s": taken.served_tokens / max(taken.served_s, 1e-9), "rollout_wait_s": taken.wait_s,
            "queued_s_mean": sum(taken.queued_s) / len(taken.queued_s), "queued_s_max": max(taken.queued_s),
            "group_latency_s_mean": sum(latency) / len(latency), "group_latency_s_max": max(latency)}


def served_generate(rollout: WorkerGroup, channel: Channel, requests: list[RolloutRequest],
                    serving: GroupResult | None = None) -> list[RolloutResult]:
    """`requests` served by the running `serve` loops (evaluation while the schedule runs), in request order."""
    submit_round_robin(rollout, requests, list(range(len(requests))), EVAL)
    results = {}
    while len(results) < len(requests):
        result = receive(channel, EVAL, serving)
        results[result.request_id] = result
    return [results[q.request_id] for q in requests]
