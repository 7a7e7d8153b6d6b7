"""Collocated with a scheduler deciding, each step, how actor and rollout share the devices
(`runner.schedule=dynamic`, collocated placement only). A step:

1. pre-process: the actor offloads, every device belongs to the rollout; each rollout replica
   generates its share and streams finished groups to the driver over a channel.
2. migrate (`runner.migrate_at` > 0): once that share of the step's groups is done, the replicas still
   generating are stopped, and their unfinished requests, with every sample's tokens so far, continue
   on the first ceil(replicas x share left) of them; the others are drained.
3. offload-sync: a replica that has served all its requests (or was drained) offloads at once; its
   devices are free.
4. scale-sync: at every optimizer-step boundary the actor asks `DeviceScheduler` which ranks train next;
   ranks on freed devices onload and join, and the next mini-batch trains as soon as its groups are in.

`handover="static"` runs the same code with the hand-over at the end of the rollout. Mini-batches are
whole prompt groups in a seeded order, advantages are per group, and `ElasticActorWorker` reduces
gradients exactly in block order, so both produce bit-identical weights and metrics. A migrated
sample draws the tokens it would have drawn, but its decode-time logprobs come from another batch;
with `rollout.logprobs=rescored` a migrating run is again bit-identical to the static one.
Left for later: the reference / critic / recomputed logprobs under this schedule.
"""

from __future__ import annotations

import time

import torch

from rlinf_like.data.tasks import Problem
from rlinf_like.runners.reasoning.checks import estimators_where
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.reasoning.phases import advantages, extra_metrics, make_requests, rl_batch, sample_metrics, score_groups
from rlinf_like.runners.reasoning.run import ReasoningRun, RunResult
from rlinf_like.runners.reasoning.run_files import Generated
from rlinf_like.runners.reasoning.schedules.elastic_rollout import ElasticRollout
from rlinf_like.runtime import Channel, Cluster, Placement, PlacementMode
from rlinf_like.runners.reasoning.schedules.device_handover import DeviceScheduler, check_handover
from rlinf_like.workers.actor.elastic import ElasticActorWorker, mean_block_metrics
from rlinf_like.workers.actor.backends import backend_class, backends_with
from rlinf_like.workers.rollout import RolloutResult
from rlinf_like.workers.rollout.engine import engine_class, engines_with


def check(cfg: ReasoningConfig) -> None:
    """What this schedule does not support yet, refused before any worker starts (`SCHEDULES` declares it)."""
    a = cfg.algorithm
    per_group = estimators_where(token_level=False, needs_critic=False)
    unsupported = {"algorithm.advantage": (a.advantage not in per_group,
                                           f"{' or '.join(per_group)} (per-group advantages)"),
                   "algorithm.kl_beta": (a.kl_beta > 0, "0 (no reference model)"),
                   "algorithm.recompute_logprobs": (a.recompute_logprobs, "false")}
    for key, (bad, allowed) in unsupported.items():
        if bad:
            raise ValueError(f"runner.schedule=dynamic needs {key} = {allowed}; got {getattr(a, key.split('.')[1])!r}")
    if cfg.runner.migrate_at and not engine_class(cfg.rollout.engine).continues_migrated:
        raise ValueError(f"runner.migrate_at > 0 needs a rollout engine that continues migrated requests "
                         f"(rollout.engine in {engines_with('continues_migrated')}); got {cfg.rollout.engine!r}")
    if cfg.actor.lora.enabled:
        raise ValueError(f"runner.schedule=dynamic with actor.lora.rank={cfg.actor.lora.rank}: LoRA in the elastic "
                         f"actor is not supported yet (use runner.schedule=static, or actor.lora.rank=0)")
    if not backend_class(cfg.actor.backend).elastic:
        raise ValueError(f"runner.schedule=dynamic needs actor.backend={' or '.join(backends_with('elastic'))} "
                         f"(its elastic actor trains data parallel over a changing set of ranks); "
                         f"got {cfg.actor.backend!r}")


def train(cfg: ReasoningConfig, handover: str = "dynamic", cluster: Cluster | None = None) -> RunResult:
    """`handover="static"` gives the devices to the actor only once the whole rollout is done, and never
    migrates: the reference a dynamic run must equal."""
    handover = check_handover(handover)
    migrate_at = cfg.runner.migrate_at if handover == "dynamic" else 0.0
    with ReasoningRun(cfg, actor_worker=ElasticActorWorker, check_placement=rank_by_rank, cluster=cluster) as run:
        w = run.workers
        tp = cfg.rollout.tp_size or w.placement["rollout"].world_size
        units = [list(range(j, j + tp)) for j in range(0, w.placement["rollout"].world_size, tp)]
        scheduler = DeviceScheduler(units, handover)
        channel = Channel.create(run.cluster.scoped_name("dynsched-results"), RolloutResult)
        rollout = ElasticRollout(w, units, scheduler, channel, migrate_at)
        for step in run.steps():
            requests, problems = make_requests(cfg, run.tasks, step, run.prompts.prompt_ids)
            start = time.perf_counter()
            w.actor.offload().wait()
            w.rollout.onload().wait()
            scheduler.pre_process(step)
            rollout.serve(requests)
            plan, groups, outs, active, early, rollout_s = minibatch_plan(cfg, step, len(requests)), {}, [], [], 0, None
            while plan or rollout.serving:
                rollout.poll()
                rollout.migrate()
                if rollout_s is None and not rollout.serving:  # every call has returned
                    rollout.finish()
                    rollout_s = time.perf_counter() - start
                active = rollout.scale(active)
                if plan and active and rollout.done([requests[i].request_id for i in plan[0]]):
                    indices = plan.pop(0)
                    done = {i: rollout.results[requests[i].request_id] for i in indices}
                    batch = minibatch(run, done, problems, groups)
                    early += bool(rollout.serving)
                    outs.append(w.actor.on_ranks(*active).train_minibatch(batch, active).wait())
            rollout.scale(active)  # every rank ends the step with the same state
            ordered = [rollout.results[q.request_id] for q in requests]
            metrics = {**optimizer_step_mean(outs), **step_sample_metrics(ordered, groups, run.version, rollout_s),
                       "sched_early_minibatches": float(early),
                       "sched_min_dp": float(min(scheduler.dp_sizes(step))),
                       "sched_migrated": float(sum(e.detail["requests"] for e in scheduler.events
                                                   if e.kind == "migrate" and e.step == step)),
                       "step_train_s": time.perf_counter() - start}
            w.rollout.onload().wait()
            run.sync_weights()
            run.end_step(step, metrics, Generated(results=ordered, problems=problems,
                                                  scores=[groups[i] for i in range(len(ordered))]))
        return run.finish(scheduler=scheduler)


def rank_by_rank(placement: Placement) -> None:
    actor, rollout = placement["actor"], placement["rollout"]
    if placement.relation("actor", "rollout") is not PlacementMode.COLLOCATED or \
            [r.device for r in actor.ranks] != [r.device for r in rollout.ranks]:
        raise ValueError("runner.schedule=dynamic needs actor and rollout collocated rank by rank "
                         "(e.g. cluster.component_placement 'actor,rollout: 0-1')")


def minibatch_plan(cfg: ReasoningConfig, step: int, num_groups: int) -> list[list[int]]:
    """Mini-batches (lists of request indices) for every epoch, in training order: a pure function of the
    seed and step, never of which replica finished first."""
    loop = cfg.actor.loop
    generator = torch.Generator().manual_seed(cfg.runner.seed * 1_000_003 + step)
    plan = []
    for _ in range(loop.epochs):
        order = torch.randperm(num_groups, generator=generator)
        plan += [sorted(chunk.tolist()) for chunk in order.tensor_split(loop.mini_batches) if len(chunk)]
    return plan


def minibatch(run: ReasoningRun, results: dict[int, RolloutResult], problems: list[Problem], groups: dict) -> dict:
    """The training batch of the finished groups `results` (request index -> result), advantages included;
    `groups` caches each group's scores (later epochs reuse them)."""
    new = [i for i in results if i not in groups]
    if new:
        groups.update(zip(new, score_groups(run.workers, [results[i] for i in new], [problems[i] for i in new])))
    batch = rl_batch(list(results.values()), run.pad_id)
    rewards = torch.tensor([[s.reward for s in groups[i]] for i in results])
    advantages(run.estimator, run.cfg, rewards, batch)
    return batch


def step_sample_metrics(ordered: list[RolloutResult], groups: dict, version: int,
                        rollout_s: float) -> dict[str, float]:
    samples = [s for i in range(len(ordered)) for s in groups[i]]
    tokens = sum(len(t) for res in ordered for t in res.response_ids)
    lengths = torch.tensor([float(len(t)) for res in ordered for t in res.response_ids])
    return {"reward": sum(s.reward for s in samples) / len(samples),
            "train_accuracy": sum(s.correct for s in samples) / len(samples),
            "train_format_rate": sum(s.formatted for s in samples) / len(samples),
            "staleness": float(version - min(r.version for r in ordered)), "response_tokens": tokens / len(samples),
            "rollout_s": rollout_s, "rollout_tokens_per_s": tokens / max(rollout_s, 1e-9),
            **sample_metrics(ordered, torch.tensor([s.reward for s in samples]), lengths), **extra_metrics(samples)}


def optimizer_step_mean(outs: list[list[dict]]) -> dict[str, float]:
    """Averaged over optimizer steps as `training/loop.py` does; blocks averaged in block order."""
    per_step = [{**mean_block_metrics(out), **{k: v for k, v in out[0].items() if k != "blocks"}} for out in outs]
    return {k: sum(m[k] for m in per_step) / len(per_step) for k in per_step[0]}
