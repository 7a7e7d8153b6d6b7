"""The phases of a reasoning RL step, as functions with explicit inputs and outputs:

    make_requests -> (rollout generates) -> score -> prepare -> update -> (sync weights)

Each phase takes the workers and data it needs and returns its batch and its metrics; nothing is
carried between phases on an object, and no phase runs inside another. The schedules in
`runners/reasoning/schedules/` call them in their own order (collocated, pipelined, dynamic).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rlinf_like.algorithms import KL_ESTIMATORS, AdvantageInputs
from rlinf_like.algorithms.offpolicy import apply_correction, mismatch_metrics
from rlinf_like.algorithms.advantage_estimators import AdvantageEstimator
from rlinf_like.data.batch import Batch, build_rl_batch
from rlinf_like.data.sources import Tasks
from rlinf_like.data.tasks import Problem
from rlinf_like.runners.reasoning.agent_format import episode_metrics, task_row
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.reasoning.worker_set import Workers
from rlinf_like.runtime import GroupResult
from rlinf_like.workers.reward.types import SampleScore
from rlinf_like.workers.rollout import RolloutRequest, RolloutResult, SamplingParams

RankPlan = Callable[[Batch, int, int], list]  # (batch, data-parallel rank, optimizer step) -> that rank's steps


@dataclass(kw_only=True)
class Scored:
    """Rollout results as one training batch (a row per sample), with what the driver reports per row."""

    batch: Batch  # model inputs: input_ids, attention_mask, response_mask, old_logprobs, advantages (zero)
    rewards: torch.Tensor  # [rows] float32
    correct: torch.Tensor  # [rows] 1.0 where the answer was right
    formatted: torch.Tensor  # [rows] 1.0 where the reward function found a final answer (`SampleScore.formatted`)
    versions: torch.Tensor  # [rows] the policy version that generated the row
    seconds: float  # time spent scoring
    extras: dict[str, float]  # the reward function's own numbers, as step metrics (`extra_metrics`)
    results: Sequence[RolloutResult] = ()  # what was scored, in row order (finish reasons; samples.jsonl's text)
    groups: Sequence[Sequence[SampleScore]] = ()  # per request, per sample: the reward worker's scores


def request_id(step: int, i: int) -> str:
    """The id of draw `step`'s i-th prompt group: the same in a resumed run (the async schedule's ledger counts by it)."""
    return f"s{step}-{i}"


def make_requests(cfg: ReasoningConfig, tasks: Tasks, step: int,
                  prompt_ids: Callable[[Problem], list[int]]) -> tuple[list[RolloutRequest], list[Problem]]:
    """Step `step`'s prompts and their problems. The draw depends on the step only, so a resumed run asks
    what the uninterrupted one would have."""
    r = cfg.runner
    rng = random.Random(r.seed * 1_000_003 + step)
    problems = tasks.draw(step, r.prompts_per_step, rng, cfg.data.seed)
    params = [SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, seed=rng.getrandbits(31))
              for _ in problems]
    requests = [RolloutRequest(request_id(step, i), prompt_ids(p), sp, cfg.algorithm.samples_per_prompt,
                               row=task_row(cfg, p)) for i, (p, sp) in enumerate(zip(problems, params))]
    return requests, problems


def submit_scores(w: Workers, results: Sequence[RolloutResult], problems: Sequence[Problem]) -> GroupResult:
    """The reward worker's call scoring each sample against its problem's answer (the reward function also gets
    the problem's row as keyword arguments); `.wait()[0]` is, per request, per sample, a `SampleScore`."""
    answers, rows = [p.answer for p in problems], [p.fields for p in problems]
    judged = w.judge.judge(list(results), answers, rows).wait()[0] if w.judge is not None else None
    return w.reward.score(list(results), answers, rows, judged)


def score_groups(w: Workers, results: Sequence[RolloutResult], problems: Sequence[Problem]) -> list[list[SampleScore]]:
    """Per request, per sample: the reward worker's score."""
    return submit_scores(w, results, problems).wait()[0]


def extra_metrics(samples: Sequence[SampleScore]) -> dict[str, float]:
    """`reward/<name>`: each number a reward function returned beside the reward, averaged over the
    samples that carry it."""
    values: dict[str, list[float]] = {}
    for s in samples:
        for name, value in s.extras.items():
            values.setdefault(name, []).append(value)
    return {f"reward/{name}": sum(v) / len(v) for name, v in values.items()}


def eval_metrics(groups: Sequence[Sequence[SampleScore]]) -> dict[str, float]:
    """Held-out metrics over each problem's first (greedy) response: accuracy, and the format rate, the share
    of responses in which the reward function found a final answer (`SampleScore.formatted`, the flag that
    `train_format_rate` averages over a step's samples)."""
    first = [group[0] for group in groups]
    return {"eval_accuracy": sum(s.correct for s in first) / len(first),
            "eval_format_rate": sum(s.formatted for s in first) / len(first), **grouped_metrics(first)}


def own_group(name: str) -> bool:
    """A metric a reward function names `<group>/<name>` (IFEval's `ifeval/prompt_loose`): a benchmark's own score,
    logged in a group of its own."""
    return "/" in name


def grouped_metrics(samples: Sequence[SampleScore]) -> dict[str, float]:
    """The numbers a reward function names `<group>/<name>` (IFEval's `ifeval/prompt_loose`, ...), averaged over
    `samples` under those names: at evaluation they are a benchmark's own scores, logged as their own group
    (`RunRecord.own_tags`)."""
    named = {name.removeprefix("reward/"): value for name, value in extra_metrics(samples).items()}
    return {name: value for name, value in named.items() if own_group(name)}


def rl_batch(results: Sequence[RolloutResult], pad_id: int) -> Batch:
    """One right-padded row per sample (prompt + response, the rollout's logprobs); a multi-turn sample's
    tool and user tokens are outside the loss (`RolloutResult.response_masks`)."""
    rows = [(res.prompt_ids, resp, lp) for res in results for resp, lp in zip(res.response_ids, res.logprobs)]
    masks = [mask for res in results for mask in (res.response_masks or [[]] * len(res.response_ids))]
    batch = build_rl_batch(*zip(*rows), [0.0] * len(rows), pad_id=pad_id, masks=masks)
    if any(res.routes for res in results):
        batch["routes"] = routes_batch(results, batch["input_ids"].shape[1])
    return batch


def routes_batch(results: Sequence[RolloutResult], width: int) -> torch.Tensor:
    """The samples' mixture-of-experts routes (`RolloutResult.routes`) as [rows, width, MoE layers, k], aligned with
    `input_ids` (padding: expert 0, which no loss reads); a sample without routes is refused by name."""
    rows = [(res.request_id, i, routes) for res in results
            for i, routes in enumerate(res.routes or [None] * len(res.response_ids))]
    missing = [f"{rid}[{i}]" for rid, i, r in rows if r is None]
    if missing:
        raise ValueError(f"routing replay: samples {missing[:4]} came back without routes (an engine without "
                         "returns_routes, or a sample finished before a migration); every sample of a step needs them")
    first = rows[0][2]
    out = torch.zeros((len(rows), width, *first.shape[1:]), dtype=first.dtype)
    for row, (_, _, routes) in enumerate(rows):
        out[row, :routes.shape[0]] = routes
    return out


def score(w: Workers, results: Sequence[RolloutResult], problems: Sequence[Problem], pad_id: int) -> Scored:
    start = time.perf_counter()
    return scored(results, score_groups(w, results, problems), pad_id, time.perf_counter() - start)


def scored(results: Sequence[RolloutResult], groups: Sequence[Sequence[SampleScore]], pad_id: int,
           seconds: float) -> Scored:
    """`results` and their scores (per request, per sample) as one training batch; `seconds` spent scoring."""
    samples = [s for group in groups for s in group]
    batch = rl_batch(results, pad_id)
    excluded = torch.tensor([bool(res.excluded) for res in results for _ in res.response_ids])
    batch["response_mask"][excluded] = 0  # an excluded group's samples carry no loss (their advantages are 0 too)
    return Scored(batch=batch,
                  rewards=torch.tensor([0.0 if out else s.reward for s, out in zip(samples, excluded.tolist())],
                                       dtype=torch.float32),
                  correct=torch.tensor([float(s.correct) for s in samples]),
                  formatted=torch.tensor([float(s.formatted) for s in samples]),
                  versions=torch.tensor([float(res.version) for res in results for _ in res.response_ids]),
                  seconds=seconds, extras={**extra_metrics(samples), **episode_metrics(results)},
                  results=list(results), groups=list(groups))


def advantages(estimator: AdvantageEstimator, cfg: ReasoningConfig, rewards: torch.Tensor,
               batch: Batch) -> dict[str, float]:
    """Writes batch["advantages"] (and the critic's batch["returns"]) from the [prompts, samples] rewards;
    returns the estimator's metrics."""
    a, mask, metrics = cfg.algorithm, batch["response_mask"], {}
    kl_penalty = None
    if a.kl_in_reward:  # checked before launch: only estimators that accept it
        kl = KL_ESTIMATORS.get(cfg.actor.loss.kl_estimator)(batch["old_logprobs"], batch["ref_logprobs"]) * mask
        kl_penalty = a.kl_beta * kl
        metrics["kl_penalty"] = float(kl.sum() / mask.sum())
    out = estimator.estimate(AdvantageInputs(rewards=rewards, response_mask=mask,
                                             values=batch.get("old_values"), kl_penalty=kl_penalty,
                                             logprobs=batch.get("old_logprobs"),
                                             teacher_logprobs=batch.get("teacher_logprobs")))
    batch["advantages"] = out.advantages
    if out.returns is not None:
        batch["returns"] = out.returns
    return {**metrics, **out.metrics, **spread("advantage", out.advantages[mask.bool()])}


def spread(name: str, values: torch.Tensor) -> dict[str, float]:
    """`<name>_std` (population), `<name>_min` and `<name>_max` of `values` (none for no values)."""
    if values.numel() == 0:
        return {}
    values = values.double()
    return {f"{name}_std": float(values.std(unbiased=False)), f"{name}_min": float(values.min()),
            f"{name}_max": float(values.max())}


def sample_metrics(results: Sequence[RolloutResult], rewards: torch.Tensor,
                   response_tokens: torch.Tensor) -> dict[str, float]:
    """What a step's samples look like beyond their mean reward: the reward's spread, the longest response
    (`response_tokens_max`, the model's tokens) and the share stopped by `runner.max_new_tokens` (`truncated_rate`,
    finish reason "length")."""
    reasons = [reason for res in results for reason in res.finish_reasons]
    return {**spread("reward", rewards), "response_tokens_max": float(response_tokens.max()),
            **({"truncated_rate": sum(r == "length" for r in reasons) / len(reasons)} if reasons else {})}


def prepare(w: Workers, estimator: AdvantageEstimator, cfg: ReasoningConfig, scored: Scored) -> tuple[Batch, dict]:
    """Everything the update needs that takes the whole batch (advantages use every sample of a group):
    reference logprobs, critic values, advantages, the trainer's own logprobs. The trainers must be resident."""
    check_excluded(cfg, scored.results)
    batch, metrics = scored.batch, {}
    start = time.perf_counter()
    if w.reference is not None:
        batch["ref_logprobs"] = torch.cat(w.reference.compute_logprobs(batch).wait())
        metrics["reference_s"] = time.perf_counter() - start
    elif w.reference_in_actor:  # LoRA: the actor's base model, adapters disabled
        batch["ref_logprobs"] = torch.cat(w.actor.reference_logprobs(batch).wait())
        metrics["reference_s"] = time.perf_counter() - start
    if w.critic is not None:
        batch["old_values"] = torch.cat(w.critic.compute_values(batch).wait())
    if w.teacher is not None:
        began = time.perf_counter()
        batch["teacher_logprobs"] = torch.cat(w.teacher.compute_logprobs(batch).wait())
        metrics["teacher_s"] = time.perf_counter() - began
    metrics.update(advantages(estimator, cfg, scored.rewards.reshape(-1, cfg.algorithm.samples_per_prompt), batch))
    if cfg.algorithm.recompute_logprobs:  # the trainer's numerics for pi_old (ranks return their rows in order)
        by_length = cfg.algorithm.recompute_by_length
        if cfg.actor.routing_replay == "R2":  # and the experts pi_old ran, which every update forward replays
            got = w.actor.compute_logprobs(batch, routes=True).wait()
            batch["recomputed_logprobs"] = torch.cat([logprobs for logprobs, _ in got])
            batch["routes"] = torch.cat([routes for _, routes in got])
        else:
            batch["recomputed_logprobs"] = torch.cat(w.actor.compute_logprobs(batch, by_length=by_length).wait())
        gap = (batch["recomputed_logprobs"] - batch["old_logprobs"]).abs() * batch["response_mask"]
        metrics["rollout_trainer_logprob_gap"] = float(gap.sum() / batch["response_mask"].sum())
        metrics.update(mismatch(cfg, batch))
    return batch, metrics


def check_excluded(cfg: ReasoningConfig, results: Sequence[RolloutResult]) -> None:
    """Groups excluded because their environment kept failing (`RolloutResult.excluded`) train on nothing; past
    agent.max_excluded_share of a step the run stops, naming the environment and the last error."""
    excluded = [res.excluded for res in results if res.excluded]
    if len(excluded) > cfg.agent.max_excluded_share * len(results):
        raise RuntimeError(f"agent.env={cfg.agent.env!r}: {len(excluded)} of {len(results)} groups of this step were "
                           f"excluded, above agent.max_excluded_share={cfg.agent.max_excluded_share}, each after "
                           f"agent.env_retries={cfg.agent.env_retries} fresh environments; the last error: "
                           f"{excluded[-1]}")


def mismatch(cfg: ReasoningConfig, batch: Batch) -> dict[str, float]:
    """The rollout-vs-trainer mismatch over the whole batch (`mismatch/*`), and what the configured correction
    clips and masks of it (the loss applies the same function to each micro-batch's whole rows)."""
    loss = cfg.actor.loss
    proximal, behaviour, mask = batch["recomputed_logprobs"], batch["old_logprobs"], batch["response_mask"]
    corrected = apply_correction(loss.is_correction, proximal - behaviour, mask, loss.thresholds)
    return mismatch_metrics(proximal, behaviour, mask, corrected)


def update(w: Workers, cfg: ReasoningConfig, batch: Batch, step: int, rank_plan: RankPlan | None = None) -> dict:
    """One update of the trained models. During critic warmup (the first `critic.warmup_steps`
    steps) only the critic trains. With `rank_plan` the driver plans each actor rank's micro-batches and
    sends it only those (the plan each rank would make itself: the same training, less data moved)."""
    warmup = w.critic is not None and step < cfg.critic.warmup_steps
    metrics = {} if warmup else train_actor(w, batch, rank_plan)
    if w.critic is not None:
        metrics.update(w.critic.train_step(batch).wait()[0], critic_warmup=float(warmup))
    return metrics


def train_actor(w: Workers, batch: Batch, rank_plan: RankPlan | None) -> dict:
    if rank_plan is None:
        return w.actor.train_step(batch).wait()[0]
    step = w.actor.on_ranks(0).status().wait()[0]["step"]  # the shuffle's seed, as in train_epochs
    calls = [w.actor.on_ranks(r).train_micro_batches(rank_plan(batch, dp.rank, step))
             for r, dp in enumerate(w.actor_dp)]
    return [call.wait()[0] for call in calls][0]


def batch_metrics(scored: Scored, version: int, rollout_s: float | None) -> dict[str, float]:
    """What a step reports about its samples: reward (mean and spread), accuracy, staleness, lengths, truncation,
    and the rollout's seconds and throughput when the step had a rollout phase (`rollout_s` None: it had not)."""
    tokens = float(scored.batch["response_mask"].sum())
    phase = {} if rollout_s is None else {"rollout_s": rollout_s,
                                           "rollout_tokens_per_s": tokens / max(rollout_s, 1e-9)}
    return {"reward": float(scored.rewards.mean()), "train_accuracy": float(scored.correct.mean()),
            "train_format_rate": float(scored.formatted.mean()),
            "staleness": float(version - scored.versions.min()), "response_tokens": tokens / len(scored.rewards),
            "reward_s": scored.seconds, **phase,
            **sample_metrics(scored.results, scored.rewards, scored.batch["response_mask"].sum(-1)), **scored.extras}
