"""Pipelined, bounded staleness: actor and rollout on their own devices. The rollout generates the next
`runner.max_staleness` steps with the weights it has while the actor trains on this one; every sample
carries the policy version that made it, and the step reports the staleness.

With `actor.loop.max_tokens_per_micro_batch` the rollout streams each finished group onto a channel and a
step trains on the first `prompts_per_step` groups to arrive, whichever step asked for them; the driver
plans each actor rank's token-budget micro-batches and sends it only those.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass

from rlinf_like.data.tasks import Problem
from rlinf_like.runners.reasoning.worker_configs import loop_terms
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.reasoning.worker_set import Workers
from rlinf_like.runners.reasoning.phases import RankPlan, batch_metrics, make_requests, prepare, score, update
from rlinf_like.runners.reasoning.run import ReasoningRun, RunResult
from rlinf_like.runners.reasoning.run_files import Generated
from rlinf_like.runtime import Channel, Cluster, GroupResult
from rlinf_like.training.loop import plan_steps
from rlinf_like.workers.actor.worker import loss_weigh
from rlinf_like.workers.rollout import RolloutRequest, RolloutResult
from rlinf_like.workers.rollout.worker import gather_results

log = logging.getLogger(__name__)


def train(cfg: ReasoningConfig, cluster: Cluster | None = None) -> RunResult:
    with ReasoningRun(cfg, cluster=cluster) as run:
        w, r = run.workers, cfg.runner
        streaming = cfg.actor.loop.max_tokens_per_micro_batch is not None  # groups stream; the driver plans micro-batches
        ahead = Generations(w, stream=run.cluster.scoped_name("rollout-results") if streaming else None)
        rank_plan = token_budget_plan(cfg, w) if streaming else None
        for step in run.steps():
            while len(ahead) <= r.max_staleness and step + len(ahead) < r.max_steps:  # run ahead, bounded
                ahead.start(*make_requests(cfg, run.tasks, step + len(ahead), run.prompts.prompt_ids))
            results, problems, rollout_s = ahead.take(r.prompts_per_step)

            scored = score(w, results, problems, run.pad_id)
            start = time.perf_counter()
            batch, prepared = prepare(w, run.estimator, cfg, scored)
            updated = update(w, cfg, batch, step, rank_plan)
            metrics = {**updated, **prepared, **batch_metrics(scored, run.version, rollout_s),
                       "train_s": time.perf_counter() - start}

            run.sync_weights()
            run.end_step(step, metrics, Generated(results=results, problems=problems, scores=scored.groups))
        ahead.close()
        return run.finish()


@dataclass
class Pending:
    call: GroupResult
    requests: list[RolloutRequest]
    problems: list[Problem]
    start: float


class Generations:
    """Rollout calls started ahead of training, oldest first. Results come back a step's requests at a time,
    or, streaming, as groups finish on a channel."""

    def __init__(self, w: Workers, stream: str | None):
        self.rollout = w.rollout
        self.pending: deque[Pending] = deque()
        self.channel = Channel.create(stream, RolloutResult) if stream else None
        self.problems: dict[str, Problem] = {}  # streaming: request id -> its problem

    def __len__(self) -> int:
        return len(self.pending)

    def start(self, requests: list[RolloutRequest], problems: list[Problem]) -> None:
        if self.channel is None:
            call = self.rollout.generate(requests)
        else:
            self.problems.update((q.request_id, p) for q, p in zip(requests, problems))
            call = self.rollout.generate_to(self.channel.name, requests)
        self.pending.append(Pending(call, requests, problems, time.perf_counter()))

    def take(self, groups: int) -> tuple[list[RolloutResult], list[Problem], float]:
        """The oldest call's results (streaming: the first `groups` groups on the channel), their problems,
        and the seconds since that call started."""
        p = self.pending.popleft()
        outputs = p.call.wait()
        if self.channel is None:
            return gather_results(outputs, p.requests), p.problems, time.perf_counter() - p.start
        results = [self.channel.get() for _ in range(groups)]
        return results, [self.problems.pop(res.request_id) for res in results], time.perf_counter() - p.start

    def close(self) -> None:
        if self.channel is not None:
            self.channel.destroy()


def token_budget_plan(cfg: ReasoningConfig, w: Workers) -> RankPlan:
    """Each actor rank's (micro-batch, loss scale) pairs: the plan the rank would make itself in train_step."""
    loop, weigh, world = cfg.actor.loop, loss_weigh(cfg.actor.loss), w.actor_dp[0].size
    r = cfg.runner
    log.info(f"pipelined with a token budget: rollout groups stream over a channel; each step trains on the first "
             f"{r.prompts_per_step} groups to arrive ({r.prompts_per_step * cfg.algorithm.samples_per_prompt} rows), "
             f"{loop.max_tokens_per_micro_batch} tokens per micro-batch and actor rank")
    terms = loop_terms(cfg)  # by tokens: no memory budget in play
    return lambda batch, rank, step: list(plan_steps(batch, rank, world, loop, step, weigh=weigh, terms=terms))
