"""Collocated, synchronous: actor and rollout share the devices and take turns, so every step is on-policy.

One step: the trainers offload, the rollout onloads and generates, then gives the devices back; the
samples are scored, prepared (reference, values, advantages) and trained on; the new weights go to
the rollout.
"""

from __future__ import annotations

import time

from rlinf_like.runners.reasoning.phases import batch_metrics, make_requests, prepare, score, update
from rlinf_like.runners.reasoning.run import ReasoningRun, RunResult
from rlinf_like.runners.reasoning.run_files import Generated
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runtime import Cluster, wait_all
from rlinf_like.workers.rollout.worker import gather_results


def train(cfg: ReasoningConfig, cluster: Cluster | None = None) -> RunResult:
    with ReasoningRun(cfg, cluster=cluster) as run:
        for step in run.steps():
            run_step(run, step)
        return run.finish()


def run_step(run: ReasoningRun, step: int) -> None:
    """One collocated step of an open run, ending with `run.end_step` (a test can stop between steps)."""
    cfg, w = run.cfg, run.workers
    requests, problems = make_requests(cfg, run.tasks, step, run.prompts.prompt_ids)

    wait_all([trainer.offload() for trainer in w.trainers])  # the devices go to the rollout
    w.rollout.onload().wait()
    start = time.perf_counter()
    results = gather_results(w.rollout.generate(requests).wait(), requests)
    rollout_s = time.perf_counter() - start
    w.rollout.offload().wait()

    scored = score(w, results, problems, run.pad_id)

    start = time.perf_counter()
    wait_all([trainer.onload() for trainer in w.trainers])  # and back to the trainers
    batch, prepared = prepare(w, run.estimator, cfg, scored)
    updated = update(w, cfg, batch, step)
    metrics = {**updated, **prepared, **batch_metrics(scored, run.version, rollout_s),
               "train_s": time.perf_counter() - start}

    w.rollout.onload().wait()
    run.sync_weights()
    run.end_step(step, metrics, Generated(results=results, problems=problems, scores=scored.groups))
