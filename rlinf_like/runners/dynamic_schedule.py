"""Collocated reasoning with a scheduler deciding, each step, how actor and rollout share the devices.

`runner.schedule=dynamic` (collocated placement only). A step:

1. pre-process: the actor offloads, every device belongs to the rollout; each rollout replica
   generates its share and streams finished groups to the driver over a channel.
2. migrate (`runner.migrate_at` > 0): once that share of the step's groups is done, the replicas
   still generating are stopped, and their unfinished requests, with every sample's tokens so far,
   continue on the first ceil(replicas x share left) of them; the others are drained.
3. offload-sync: a replica that has served all its requests (or was drained) offloads at once and
   reports it; its devices are free.
4. scale-sync: at every optimizer-step boundary the actor asks `DeviceScheduler` which ranks train
   next; ranks on freed devices onload and join (taking the current state from an active rank),
   and the next mini-batch trains as soon as its groups are in, on however many ranks are active.

The static schedule runs the same code with the hand-over at the end (every device joins once the
whole rollout has offloaded). Mini-batches are whole prompt groups in a seeded order, advantages are
per group (grpo / rloo), and `ElasticActorWorker` reduces gradients exactly in block order, so both
schedules produce bit-identical weights and metrics; only timings and the recorded events differ.
A migrated sample draws the tokens it would have drawn (per-sample noise, `sampling.py`), but its
decode-time logprobs come from another batch and differ in the last bits; with
`rollout.logprobs=rescored` they are a function of the tokens alone, and a migrating run is again
bit-identical to the static one. Left for later: the reference / critic / recomputed logprobs under
this schedule.
"""

from __future__ import annotations

import time
from collections import deque

import ray
import torch

from rlinf_like.data.batch import build_rl_batch
from rlinf_like.runners.config import COMPONENTS, ReasoningConfig
from rlinf_like.runners.reasoning import ReasoningRunner, check_finite
from rlinf_like.scheduler import Channel, Cluster, PlacementMode
from rlinf_like.scheduler.dynamic import DeviceScheduler, check_schedule
from rlinf_like.scheduler.errors import ChannelTimeout
from rlinf_like.workers.actor.elastic import ElasticActorWorker, mean_block_metrics
from rlinf_like.scheduler.worker_group import GroupResult
from rlinf_like.workers.rollout import RolloutRequest, RolloutResult, continuation

POLL_S = 0.02  # how long the driver waits on the result channel before checking replicas again
DRAIN_S = 120.0  # after an abort, how long a stopped replica's last results may take to arrive


def check_dynamic(cfg: ReasoningConfig) -> None:
    """What this schedule does not support yet, refused before any worker starts."""
    check_schedule(cfg.runner.schedule)
    a = cfg.algorithm
    unsupported = {"algorithm.advantage": (a.advantage not in ("grpo", "rloo"), "grpo or rloo (per-group advantages)"),
                   "algorithm.kl_beta": (a.kl_beta > 0, "0 (no reference model)"),
                   "algorithm.recompute_logprobs": (a.recompute_logprobs, "false")}
    for key, (bad, allowed) in unsupported.items():
        if bad:
            raise ValueError(f"runner.schedule=dynamic needs {key} = {allowed}; got {getattr(a, key.split('.')[1])!r}")
    if cfg.runner.migrate_at and cfg.rollout.engine == "hf":
        raise ValueError("runner.migrate_at > 0 needs a rollout engine that continues migrated requests "
                         "(rollout.engine=native or sglang); got 'hf'")


class DynamicScheduleRunner(ReasoningRunner):
    actor_worker = ElasticActorWorker

    def __init__(self, cfg: ReasoningConfig, schedule: str | None = None):
        """`schedule` overrides cfg.runner.schedule: "static" runs this runner's code with the hand-over
        at the end of the rollout (the reference a dynamic run must equal)."""
        check_dynamic(cfg)
        super().__init__(cfg)
        self.schedule = check_schedule(schedule or cfg.runner.schedule)
        self.migrate_at = cfg.runner.migrate_at if self.schedule == "dynamic" else 0.0  # static: the reference

    def _launch(self, cluster: Cluster) -> None:
        placement = cluster.place(known_components=COMPONENTS)
        actor, rollout = placement["actor"], placement["rollout"]
        if placement.relation("actor", "rollout") is not PlacementMode.COLLOCATED or \
                [r.device for r in actor.ranks] != [r.device for r in rollout.ranks]:
            raise ValueError("runner.schedule=dynamic needs actor and rollout collocated rank by rank "
                             "(e.g. cluster.component_placement 'actor,rollout: 0-1')")
        super()._launch(cluster)
        tp = self.cfg.rollout.tp_size or rollout.world_size
        self.units = [list(range(j, j + tp)) for j in range(0, rollout.world_size, tp)]
        self.scheduler = DeviceScheduler(self.units, self.schedule)
        self.channel: Channel[RolloutResult] = Channel.create(cluster.scoped_name("dynsched-results"), RolloutResult)

    # --- one step -----------------------------------------------------------------------------------
    def _plan(self, step: int, num_groups: int) -> list[list[int]]:
        """Mini-batches (lists of request indices) for every epoch, in training order: a pure function of
        the seed and step, never of which replica finished first."""
        a = self.cfg.algorithm
        generator = torch.Generator().manual_seed(self.cfg.runner.seed * 1_000_003 + step)
        plan = []
        for _ in range(a.epochs):
            order = torch.randperm(num_groups, generator=generator)
            plan += [sorted(chunk.tolist()) for chunk in order.tensor_split(a.mini_batches) if len(chunk)]
        return plan

    def _take(self, results: dict, partials: dict, timeout: float) -> None:
        """Every result on the channel (waiting up to `timeout` for the first): complete or stopped part-way."""
        while True:
            try:
                result = self.channel.get(timeout=timeout)
            except ChannelTimeout:
                return
            (partials if result.partial else results)[result.request_id] = result
            timeout = 0.0

    def _drain(self, ids: list[str], results: dict, partials: dict) -> None:
        """Wait until every request in `ids` has reported (the calls serving them have returned)."""
        deadline = time.monotonic() + DRAIN_S
        while missing := [i for i in ids if i not in results and i not in partials]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the rollout calls serving requests {missing[:5]} returned without reporting them")
            self._take(results, partials, POLL_S)

    def _serve(self, unit: int, requests: list[RolloutRequest]) -> GroupResult:
        return self.rollout.on_ranks(*self.units[unit]).serve_to(self.channel.name, requests)

    def _hand_over(self, unit: int) -> None:
        self.rollout.on_ranks(*self.units[unit]).offload().wait()
        self.scheduler.offload_sync(unit)

    def _poll(self, serving: dict[int, GroupResult], results: dict, partials: dict) -> None:
        """Take finished groups off the channel; offload every replica that has served all its requests."""
        self._take(results, partials, POLL_S)
        for unit, handle in list(serving.items()):
            ready, _ = ray.wait(handle.refs, num_returns=len(handle.refs), timeout=0)
            if len(ready) == len(handle.refs):
                handle.wait()  # raises a replica's error, naming its rank
                self._hand_over(unit)
                del serving[unit]
                return  # one hand-over per poll: each replica's devices get their own scale-sync

    def _migrate(self, serving: dict[int, GroupResult], results: dict, partials: dict, requests: dict) -> None:
        """When enough of the step is done, move the unfinished requests onto fewer replicas and drain the rest."""
        plan = self.scheduler.plan_migration(len(results) / len(requests), list(serving), self.migrate_at)
        if plan is None:
            return
        kept, drained = plan
        units = kept + drained  # every serving unit
        stopping = [self.rollout.on_ranks(*self.units[u]).abort() for u in units]
        for call in stopping:
            call.wait()
        for unit in units:
            serving.pop(unit).wait()  # every result is on the channel once the call has returned
        open_ids = [i for i in requests if i not in results]
        self._drain(open_ids, results, partials)
        moved = [continuation(requests[i], partials.pop(i)) for i in open_ids if i not in results]
        self.scheduler.migrate(drained, kept, len(moved))
        for unit in drained:
            self._hand_over(unit)
        for k, unit in enumerate(kept):
            serving[unit] = self._serve(unit, moved[k :: len(kept)])

    def _scale(self, active: list[int]) -> list[int]:
        """scale-sync: onload and bring in the ranks the scheduler grants now."""
        granted, joining = self.scheduler.scale_sync()
        if joining:
            self.actor.on_ranks(*joining).onload().wait()
            if active:  # the first ranks of a step already hold the state all ranks ended the last step with
                source = active[0]
                self.actor.on_ranks(source, *joining).join(source, joining).wait()
        return granted

    def _minibatch(self, groups: list[int], reqs, problems, results, scores) -> dict:
        new = [i for i in groups if i not in scores]  # later epochs reuse the scores
        if new:
            found = self.reward.score([results[reqs[i].request_id] for i in new], [problems[i].answer for i in new])
            scores.update(zip(new, found.wait()[0]))
        rewards = torch.tensor([[s["reward"] for s in scores[i]] for i in groups])
        rows = [(res.prompt_ids, resp, lp) for res in (results[reqs[i].request_id] for i in groups)
                for resp, lp in zip(res.response_ids, res.logprobs)]
        batch = build_rl_batch(*zip(*rows), [0.0] * len(rows), pad_id=self.tokenizer.pad_token_id or 0)
        batch["advantages"], _ = self._advantages(rewards, batch)
        return batch

    def _rollout_and_train(self, step: int, pending: deque) -> dict[str, float]:
        reqs, problems = self._requests(step)
        start = time.perf_counter()
        self.actor.offload().wait()
        self.rollout.onload().wait()
        self.scheduler.pre_process(step)
        serving = {j: self._serve(j, reqs[j :: len(self.units)]) for j in range(len(self.units))}
        results: dict[str, RolloutResult] = {}
        partials: dict[str, RolloutResult] = {}
        by_id = {q.request_id: q for q in reqs}
        scores: dict[int, list[dict]] = {}
        plan, outs, active, early, rollout_s = self._plan(step, len(reqs)), [], [], 0, None
        while plan or serving:
            self._poll(serving, results, partials)
            self._migrate(serving, results, partials, by_id)
            if rollout_s is None and not serving:  # every call has returned: all results are on the channel
                self._drain(list(by_id), results, partials)
                if partials:
                    raise RuntimeError(f"requests {sorted(partials)[:5]} came back part-done with nothing to continue them")
                rollout_s = time.perf_counter() - start
            active = self._scale(active)
            if plan and active and all(reqs[i].request_id in results for i in plan[0]):
                batch = self._minibatch(plan.pop(0), reqs, problems, results, scores)
                early += bool(serving)
                outs.append(self.actor.on_ranks(*active).train_minibatch(batch, active).wait())
        self._scale(active)  # every rank ends the step with the same state
        metrics = self._step_metrics(outs)
        warning = check_finite(metrics, step + 1, self.cfg.runner.nonfinite)
        if warning:
            print(warning)
        self.rollout.onload().wait()
        ordered = [results[q.request_id] for q in reqs]
        tokens = sum(len(t) for res in ordered for t in res.response_ids)
        rewards = [s["reward"] for i in range(len(reqs)) for s in scores[i]]
        correct = [s["correct"] for i in range(len(reqs)) for s in scores[i]]
        return {**metrics, "reward": sum(rewards) / len(rewards), "train_accuracy": sum(correct) / len(correct),
                "staleness": float(self.version - min(r.version for r in ordered)),
                "response_tokens": tokens / len(rewards), "rollout_s": rollout_s,
                "rollout_tokens_per_s": tokens / max(rollout_s, 1e-9),
                "sched_early_minibatches": float(early), "sched_min_dp": float(min(self.scheduler.dp_sizes(step))),
                "sched_migrated": float(sum(e.detail["requests"] for e in self.scheduler.events
                                            if e.kind == "migrate" and e.step == step)),
                "step_train_s": time.perf_counter() - start}

    @staticmethod
    def _step_metrics(outs: list[list[dict]]) -> dict[str, float]:
        """Averaged over optimizer steps as `training/loop.py` does; blocks averaged in block order."""
        per_step = [{**mean_block_metrics(out), **{k: v for k, v in out[0].items() if k != "blocks"}} for out in outs]
        return {k: sum(m[k] for m in per_step) / len(per_step) for k in per_step[0]}
