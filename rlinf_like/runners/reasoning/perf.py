"""Each step's distance to the hardware limit: model FLOP/s and MFU of the training and rollout phases.

The FLOPs are the model's (`utils/flops.py`) for the tokens the step computed; the limit is this host's measured
matmul peak for one rank (`utils/peak.py`) times the ranks of the phase. Like memory, the figures differ between
otherwise identical runs, so they go to the trackers (`grpo/perf/*`) and the closing lines, not to the history.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.utils.flops import ModelShape, rollout_flops, shared_forward, shares, train_flops
from rlinf_like.utils.peak import Peak, matmul_peak
from rlinf_like.workers.rollout import RolloutResult


@dataclass
class StepPerf:
    shape: ModelShape
    peak: Peak | None  # None: no peak for these devices (a GPU the driver cannot see)
    actor_ranks: int
    rollout_ranks: int
    updates: int  # forward-backward passes over each row: the actor's epochs
    forwards: int  # the actor's forward-only passes in the training phase: a recomputation of pi_old's, the
    # reference's under LoRA (the base with adapters disabled)
    frozen_base: bool  # LoRA: no weight gradients for the base
    reference: bool  # a separate reference worker runs one forward over the batch
    shared_train: bool  # the actor runs each prompt once for all its samples (actor.loop.share_prompt)
    shared_prompt: bool  # the engine prefills a request's prompt once for all its samples (its prefix cache)
    rescored: bool  # the engine runs one more pass over prompt + response for the logprobs
    seen: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def of_run(cls, cfg: ReasoningConfig, model_path: str, precision: str, device_kind: str, actor_ranks: int,
               rollout_ranks: int, shared_train: bool = False, reference_in_actor: bool = False) -> StepPerf:
        peak = None
        if device_kind == "cpu":
            peak = matmul_peak(precision, "cpu", int(os.environ.get("OMP_NUM_THREADS", "1")))
        else:
            import torch

            if torch.cuda.is_available():
                peak = matmul_peak(precision, "cuda:0")
        reference = cfg.algorithm.kl_beta > 0
        return cls(ModelShape.from_path(model_path), peak, actor_ranks, rollout_ranks,
                   updates=cfg.actor.loop.epochs,
                   forwards=int(reference and reference_in_actor) + int(cfg.algorithm.recompute_logprobs),
                   frozen_base=cfg.actor.lora.rank > 0, reference=reference and not reference_in_actor,
                   shared_train=shared_train, shared_prompt=cfg.rollout.prefix_cache,
                   rescored=cfg.rollout.logprobs == "rescored")

    def step(self, results: Sequence[RolloutResult], train_s: float | None, rollout_s: float | None) -> dict:
        """`perf/tflops_{train,rollout}` (model TFLOP/s) and `perf/mfu_{train,rollout}` (their share of the peak)."""
        rows = [(len(r.prompt_ids), len(ids)) for r in results for ids in r.response_ids]
        requests = [(len(r.prompt_ids), [len(i) for i in r.response_ids]) for r in results]
        row_forward = train_flops(self.shape, rows, updates=0, forwards=1)
        actor_forward = row_forward
        if self.shared_train:  # each group as the actor lays it out: shared where that is the cheaper forward
            actor_forward = sum(shared_forward(self.shape, [(p, rs)]) if shares(self.shape, p, rs) else
                                train_flops(self.shape, [(p, r) for r in rs], updates=0, forwards=1)
                                for p, rs in requests)
        passes = self.updates * (2.0 if self.frozen_base else 3.0) + self.forwards
        # a reference worker lays out shared prompts when the actor does (the same model and loop settings)
        work = {"train": (actor_forward * (passes + self.reference), train_s, self.actor_ranks),
                "rollout": (rollout_flops(self.shape, [(len(r.prompt_ids), [len(i) for i in r.response_ids])
                                                       for r in results], shared_prompt=self.shared_prompt)
                            + (train_flops(self.shape, rows, updates=0, forwards=1) if self.rescored else 0.0),
                            rollout_s, self.rollout_ranks)}
        out = {}
        for phase, (flops, seconds, ranks) in work.items():
            if not seconds or seconds <= 0 or not rows:
                continue
            out[f"perf/tflops_{phase}"] = flops / seconds / 1e12
            if self.peak is not None:
                out[f"perf/mfu_{phase}"] = flops / seconds / (self.peak.flops_per_s * ranks)
        for k, v in out.items():
            self.seen.setdefault(k, []).append(v)
        return out

    def summary(self) -> str:
        """The closing line: the median of each figure over the run's steps, with the peak it is measured against."""
        if not self.seen:
            return ""
        parts = []
        for phase, ranks in (("train", self.actor_ranks), ("rollout", self.rollout_ranks)):
            if f"perf/tflops_{phase}" not in self.seen:
                continue
            gflops = statistics.median(self.seen[f"perf/tflops_{phase}"]) * 1e3
            mfu = self.seen.get(f"perf/mfu_{phase}")
            parts.append(f"{phase} {gflops:,.1f} GFLOP/s on {ranks} rank(s)"
                         + (f", MFU {statistics.median(mfu):.1%}" if mfu else ""))
        peak = self.peak.describe() if self.peak is not None else "no measured peak for these devices"
        return "model FLOP/s, median over steps: " + "; ".join(parts) + f" ({peak})"
