"""Collocated reasoning with a scheduler deciding, each step, how actor and rollout share the devices.

`runner.schedule=dynamic` (collocated placement only). A step:

1. pre-process: the actor offloads, every device belongs to the rollout; each rollout replica
   generates its share and streams finished groups to the driver over a channel.
2. offload-sync: a replica that has served all its requests offloads at once and reports it; its
   devices are free.
3. scale-sync: at every optimizer-step boundary the actor asks `DeviceScheduler` which ranks train
   next; ranks on freed devices onload and join (taking the current state from an active rank),
   and the next mini-batch trains as soon as its groups are in, on however many ranks are active.

The static schedule runs the same code with the hand-over at the end (every device joins once the
whole rollout has offloaded). Mini-batches are whole prompt groups in a seeded order, advantages are
per group (grpo / rloo), and `ElasticActorWorker` reduces gradients exactly in block order, so both
schedules produce bit-identical weights and metrics; only timings and the recorded events differ.
Left for later: migrating a replica's unfinished requests to other replicas (the unit handed over
is a whole replica), and the reference / critic / recomputed logprobs under this schedule.
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
from rlinf_like.workers.rollout import RolloutResult

POLL_S = 0.02  # how long the driver waits on the result channel before checking replicas again


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


class DynamicScheduleRunner(ReasoningRunner):
    actor_worker = ElasticActorWorker

    def __init__(self, cfg: ReasoningConfig, schedule: str | None = None):
        """`schedule` overrides cfg.runner.schedule: "static" runs this runner's code with the hand-over
        at the end of the rollout (the reference a dynamic run must equal)."""
        check_dynamic(cfg)
        super().__init__(cfg)
        self.schedule = check_schedule(schedule or cfg.runner.schedule)

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
        self.channel: Channel[RolloutResult] = Channel.create(f"{cluster.config.namespace}-dynsched-results",
                                                              RolloutResult)

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

    def _poll(self, generating: dict, results: dict) -> None:
        """Take finished groups off the channel; offload every replica that has served all its requests."""
        try:
            result = self.channel.get(timeout=POLL_S)
            results[result.request_id] = result
        except ChannelTimeout:
            pass
        for unit, handle in list(generating.items()):
            ready, _ = ray.wait(handle.refs, num_returns=len(handle.refs), timeout=0)
            if len(ready) == len(handle.refs):
                handle.wait()  # raises a replica's error, naming its rank
                self.rollout.on_ranks(*self.units[unit]).offload().wait()
                self.scheduler.offload_sync(unit)
                del generating[unit]
                return  # one hand-over per poll: each replica's devices get their own scale-sync

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
        generating = {j: self.rollout.on_ranks(*unit).generate_to(self.channel.name, reqs)
                      for j, unit in enumerate(self.units)}
        results: dict[str, RolloutResult] = {}
        scores: dict[int, list[dict]] = {}
        plan, outs, active, early, rollout_s = self._plan(step, len(reqs)), [], [], 0, None
        while plan or generating:
            self._poll(generating, results)
            if rollout_s is None and not generating:
                rollout_s = time.perf_counter() - start
            active = self._scale(active)
            if plan and active and all(reqs[i].request_id in results for i in plan[0]):
                batch = self._minibatch(plan.pop(0), reqs, problems, results, scores)
                early += bool(generating)
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
                "step_train_s": time.perf_counter() - start}

    @staticmethod
    def _step_metrics(outs: list[list[dict]]) -> dict[str, float]:
        """Averaged over optimizer steps as `workers/training.py` does; blocks averaged in block order."""
        per_step = [{**mean_block_metrics(out), **{k: v for k, v in out[0].items() if k != "blocks"}} for out in outs]
        return {k: sum(m[k] for m in per_step) / len(per_step) for k in per_step[0]}
