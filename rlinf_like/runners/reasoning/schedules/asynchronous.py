"""Asynchronous: the rollout replicas serve without a step boundary while the actor trains.

The rollout (its own devices, tp_size 1 per replica) runs one long `serve` call. The driver keeps it fed with
prompt groups as `runner.stale_policy` and `runner.max_staleness` allow (`runners/reasoning/async_stream.py`), takes a
step's groups as they finish, trains, and announces the new weights: each replica receives them before its
next decode step, without draining, so samples in flight finish under the new weights (a partial rollout;
every token's version is kept). A step reports the serve loops' throughput and queueing (`serve_metrics`), not
a rollout phase. While the trainer works, the driver takes the groups that finish and starts
their reward calls, so the next step's scoring is off the critical path. Evaluation goes through the same
serve loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from rlinf_like.runners.reasoning.async_stream import (GroupStream, Taken, account, serve_metrics, served_generate,
                                                      staleness_metrics)
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.reasoning.phases import Scored, batch_metrics, make_requests, prepare, scored, submit_scores, update
from rlinf_like.runners.reasoning.run import ReasoningRun, RunResult
from rlinf_like.runners.reasoning.run_files import Generated
from rlinf_like.runtime import Channel, Cluster, GroupResult, WorkerGroup, wait_all
from rlinf_like.workers.rollout import RolloutResult
from rlinf_like.workers.rollout.engine import check_serves_continuously

T = TypeVar("T")
log = logging.getLogger(__name__)
PUMP_S = 0.02  # how long each wait for a finished group lasts while the trainer works


def check(cfg: ReasoningConfig) -> None:
    """The engine must serve continuously, one rank per replica (`SCHEDULES` declares this check)."""
    check_serves_continuously(cfg.rollout, "runner.schedule=async")


def train(cfg: ReasoningConfig, cluster: Cluster | None = None) -> RunResult:
    with ReasoningRun(cfg, cluster=cluster) as run:
        w, r = run.workers, cfg.runner
        channel = Channel.create(run.cluster.scoped_name("async-groups"), RolloutResult)
        serving = w.rollout.serve(channel.name)  # runs until close_serving
        stream = GroupStream(rollout=w.rollout, channel=channel, per_step=r.prompts_per_step,
                             max_staleness=r.max_staleness, policy=r.stale_policy, serving=serving,
                             draw=lambda step: make_requests(cfg, run.tasks, step, run.prompts.prompt_ids),
                             scorer=lambda results, problems: submit_scores(w, results, problems))
        try:
            run.serve_through(Served(w.rollout, channel, serving, stream))
            for step in run.steps():
                stream.top_up(step)
                taken = stream.take(step, run.version)
                graded = score_taken(w, taken, run.pad_id)

                start = time.perf_counter()
                batch, prepared, updated = while_pumping(stream, lambda: train_on(w, run, graded, step))
                metrics = {**updated, **prepared, **batch_metrics(graded, run.version, None), **serve_metrics(taken),
                           **staleness_metrics(taken, run.version), "train_s": time.perf_counter() - start}

                run.sync_weights()  # the serve loops pick the new version up between decode steps
                run.end_step(step, metrics, Generated(results=taken.results, problems=taken.problems,
                                                      scores=graded.groups))
            # the committed ledger, a resumed run's included: each group trained on once, none lost
            samples = account(stream.ledger, r.prompts_per_step, r.stale_policy)
            (log.info if samples.complete else log.warning)(f"async samples: {samples}")
            result = run.finish(samples=samples)
        except BaseException:
            stop_serving(w, serving, channel, failing=True)  # the first error is the one to report
            raise
        stop_serving(w, serving, channel, failing=False)
        return result


@dataclass
class Served:
    """The running serve loops as the run reaches them (`ReasoningRun.serve_through`): evaluation requests go in
    under their own key, weights arrive between decode steps, and the stream's groups are checkpointed."""

    rollout: WorkerGroup
    channel: Channel
    serving: GroupResult
    stream: GroupStream

    def generate(self, requests: list) -> list[RolloutResult]:
        return served_generate(self.rollout, self.channel, requests, self.serving)

    def receive_weights(self, version: int) -> GroupResult:
        return self.rollout.update_weights(version)

    def state(self) -> dict:
        return self.stream.state()

    def restore(self, state: dict) -> None:
        self.stream.restore(state)


def score_taken(w, taken: Taken, pad_id: int) -> Scored:
    """The step's groups scored: most were scored as they arrived; the rest (restored from a checkpoint) now."""
    start = time.perf_counter()
    calls = [call or submit_scores(w, [res], [problem])
             for call, res, problem in zip(taken.scoring, taken.results, taken.problems, strict=True)]
    groups = [group for call in calls for group in call.wait()[0]]
    return scored(taken.results, groups, pad_id, time.perf_counter() - start)


def train_on(w, run: ReasoningRun, graded: Scored, step: int) -> tuple:
    batch, prepared = prepare(w, run.estimator, run.cfg, graded)
    return batch, prepared, update(w, run.cfg, batch, step)


def while_pumping(stream: GroupStream, work: Callable[[], T]) -> T:
    """`work()` (the trainer's calls) in a thread while this one takes the groups that finish meanwhile and
    starts their reward calls: scoring the next step overlaps training this one."""
    with ThreadPoolExecutor(1, thread_name_prefix="train") as pool:
        done = pool.submit(work)
        while not done.done():
            stream.pump(PUMP_S)
        return done.result()


def stop_serving(w, serving, channel: Channel, failing: bool) -> None:
    """End the serve loops (groups still generating are not needed) and drop the channel. When the run is
    already failing (a dead replica, say), errors here are not raised: they would hide the first one."""
    try:
        wait_all([w.rollout.close_serving(), w.rollout.abort()])
        serving.wait()
        channel.destroy()
    except Exception:
        if not failing:
            raise
