"""What every reasoning schedule shares around its loop: the run directory, data, tokenizer, workers,
SFT warm-start, evaluation, weight sync, metrics, checkpoints and the closing summary. A schedule opens
a `ReasoningRun`, iterates `run.steps()`, calls the phases, and ends each step with `run.end_step`.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from rlinf_like.algorithms import build_estimator
from rlinf_like.data.batch import build_sft_batch
from rlinf_like.data.prompts import PromptFormat
from rlinf_like.data.sources import Tasks, load_tasks
from rlinf_like.models import load_tokenizer
from rlinf_like.models.export import complete_export
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.checks import check_config, check_finite
from rlinf_like.runners.common import Checkpoints, crash_point, plot_series
from rlinf_like.runners.config import ReasoningConfig
from rlinf_like.runners.launch import launch_reference, launch_workers
from rlinf_like.runners.agent_format import AgentFormat, episode_metrics, task_row
from rlinf_like.runners.phases import eval_metrics, score_groups
from rlinf_like.scheduler import Cluster, Placement, wait_all
from rlinf_like.utils.tracking import make_trackers
from rlinf_like.workers.actor.worker import ActorWorker
from rlinf_like.workers.rollout import RolloutRequest, SamplingParams
from rlinf_like.workers.rollout.worker import gather_results

log = logging.getLogger(__name__)
CHECKPOINT = "checkpoint"
REFERENCE_MODEL = "reference_model"  # the warm-started policy, exported once: what the KL term pulls toward
FINAL_MODEL = "final_model"  # the trained model as a transformers folder: weights, tokenizer, chat template


def model_path(cfg: ReasoningConfig, out: Path) -> str:
    """`model.path`, or the tiny model the model section describes, written under the run directory."""
    m = cfg.model
    if m.path:
        return m.path
    spec = TinyModelSpec(arch=m.arch, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                         num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                         init_std=m.init_std, seed=m.seed, max_position_embeddings=m.max_positions)
    return str(write_tiny_model(out / "init_model", spec))


@dataclass(kw_only=True)
class RunResult:
    summary: dict
    history: list[dict]
    extras: dict = field(default_factory=dict)  # what a schedule reports beyond the history


class ReasoningRun:
    """Use as a context manager: entering starts the cluster and the workers and resumes (or warm-starts and
    evaluates); leaving stops the cluster."""

    def __init__(self, cfg: ReasoningConfig, actor_worker: type[ActorWorker] = ActorWorker,
                 check_placement: Callable[[Placement], None] | None = None):
        """`actor_worker` and `check_placement` are a schedule's: its actor class, and what it needs of the
        placement (checked before any worker starts)."""
        check_config(cfg)
        self.cfg = cfg
        self.out = Path(cfg.runner.output_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.checkpoints = Checkpoints(self.out / CHECKPOINT)
        self.tasks: Tasks = load_tasks(cfg.data)
        if cfg.runner.sft_steps > 0 and not self.tasks.sft:
            raise ValueError(f"runner.sft_steps={cfg.runner.sft_steps} needs SFT problems; data.source="
                             f"{cfg.data.source} gives none (data.sft_problems=0?): set runner.sft_steps=0")
        self.model_path = model_path(cfg, self.out)
        self.tokenizer = load_tokenizer(self.model_path)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.prompts = AgentFormat(self.tokenizer, cfg) if cfg.agent.multi_turn else PromptFormat(self.tokenizer, cfg.data)
        first = self.tasks.test[0]  # where users debug their templates: the first prompt as the model sees it
        log.info(f"first prompt {self.prompts.describe(first)}")
        self.estimator = build_estimator(cfg.algorithm.advantage, cfg.algorithm)
        self.actor_worker, self.check_placement = actor_worker, check_placement
        self.history: list[dict] = []
        self.step = 0  # optimizer steps done
        self.version = 0  # the weights' version the rollout holds
        self._clock = 0.0  # RL seconds so far, without evaluations and checkpoints
        self.sync_metrics: dict[str, float] = {}  # the last weight sync's bytes and seconds
        # What a schedule may swap (the async one: its rollout serves continuously, so requests and weights go
        # to the running serve loop instead of calls that would queue behind it).
        self.generate: Callable[[list[RolloutRequest]], list] = self._generate
        self.receive_weights: Callable[[int], object] = lambda version: self.workers.rollout.apply_weights(version)
        self.extra_state: Callable[[], dict] | None = None  # saved with each checkpoint
        self.resumed_extra: dict = {}  # what the checkpoint resumed from saved of it

    def longest_prompt(self, sample: int = 512) -> int | None:
        """Tokens of the longest prompt among the first `sample` RL and test problems (what sizes the rollout's
        KV cache; a longer one later still runs). None for multi-turn runs, whose context grows turn by turn."""
        if self.cfg.agent.multi_turn:
            return None
        problems = list(self.tasks.pool[:sample]) + list(self.tasks.test[:sample])
        return max((len(self.prompts.prompt_ids(p)) for p in problems), default=0)

    # --- start and stop ------------------------------------------------------------------------------
    def __enter__(self) -> ReasoningRun:
        self.cluster = Cluster(self.cfg.cluster).__enter__()
        try:
            self.workers = launch_workers(self.cfg, self.cluster, self.model_path, self.estimator, self.out,
                                          self.actor_worker, self.check_placement, self.longest_prompt())
            if self.cfg.runner.resume and self.checkpoints.exists():
                self._restore()
            else:
                self._warm_start()
                self.history.append({"step": 0, **self.evaluate()})
            start = self.out / REFERENCE_MODEL if self.cfg.runner.sft_steps > 0 else Path(self.model_path)
            launch_reference(self.cfg, self.cluster, self.workers, start, self.out)
        except BaseException:
            self.cluster.__exit__(None, None, None)
            raise
        self.trackers = make_trackers(self.cfg.logger, self.out, run_config=asdict(self.cfg))
        self._clock = self.history[-1].get("elapsed_s", 0.0)
        return self

    def __exit__(self, *exc) -> None:
        self.trackers.close()
        self.cluster.__exit__(*exc)

    def _warm_start(self) -> None:
        r, w = self.cfg.runner, self.workers
        if r.sft_steps <= 0:
            return
        rng = random.Random(r.seed)
        w.actor.set_lr(r.sft_lr).wait()
        for _ in tqdm(range(r.sft_steps), desc="SFT warm-start", unit="step"):
            items = [rng.choice(self.tasks.sft) for _ in range(r.sft_batch_size)]
            rows = [self.prompts.sft_ids(p) for p in items]  # (prompt, target[, target mask: multi-turn])
            batch = build_sft_batch([r[0] for r in rows], [r[1] for r in rows],
                                    target_masks=[r[2] for r in rows] if len(rows[0]) == 3 else None)
            w.actor.sft_step(batch).wait()
        w.actor.set_lr(self.cfg.algorithm.lr).wait()
        self.sync_weights()
        if self.cfg.algorithm.kl_beta > 0 and not w.reference_in_actor:
            w.actor.export_hf(str(self.out / REFERENCE_MODEL)).wait()

    # --- used by every schedule ------------------------------------------------------------------------
    def sync_weights(self) -> None:
        """The actor's weights to the rollout, as the next version."""
        self.version += 1
        start = time.perf_counter()
        sent, _ = wait_all([self.workers.actor.publish_weights(self.version), self.receive_weights(self.version)])
        # what the step's sync moved (under LoRA, after the first round: the adapted weights only)
        self.sync_metrics = {"sync_bytes": float(sum(sent)), "sync_s": time.perf_counter() - start}

    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy and format rate on the held-out set (`eval_accuracy`, `eval_format_rate`)."""
        w, test = self.workers, self.tasks.test
        greedy = SamplingParams(max_new_tokens=self.cfg.runner.max_new_tokens, temperature=0.0)
        reqs = [RolloutRequest(f"eval-{i}", self.prompts.prompt_ids(p), greedy, row=task_row(self.cfg, p))
                for i, p in enumerate(test)]
        results = self.generate(reqs)
        if self.cfg.agent.multi_turn:  # what the agent does, for people: the first held-out episode
            tqdm.write(f"held-out episode at step {self.step}:\n{self.prompts.trajectory(results[0])}")
        return {**eval_metrics(score_groups(w, results, test)),
                **{f"eval_{k}": v for k, v in episode_metrics(results).items()}}

    def _generate(self, requests: list[RolloutRequest]) -> list:
        return gather_results(self.workers.rollout.generate(requests).wait(), requests)

    def steps(self) -> Iterator[int]:
        """The steps left to run (0-based), with a progress bar."""
        r = self.cfg.runner
        self._bar = tqdm(range(self.step, r.max_steps), desc="GRPO", unit="step", initial=self.step,
                         total=r.max_steps)
        for step in self._bar:
            self._step_start = time.perf_counter()
            yield step

    def end_step(self, step: int, metrics: dict[str, float]) -> None:
        """After the step's weight sync: time it, evaluate when due, log, checkpoint when due."""
        r = self.cfg.runner
        self._clock += time.perf_counter() - self._step_start
        self.step = step + 1
        warning = check_finite(metrics, self.step, r.nonfinite)
        if warning:
            tqdm.write(warning)
        metrics["elapsed_s"] = self._clock
        metrics.update(self.sync_metrics)
        if self.step % r.eval_every == 0 or self.step == r.max_steps:
            metrics.update(self.evaluate())
        self.trackers.log({f"grpo/{k}": v for k, v in metrics.items()}, self.step)
        self.history.append({"step": self.step, **metrics})
        nan = float("nan")
        self._bar.set_postfix(reward=f"{metrics['reward']:.2f}", acc=f"{metrics.get('eval_accuracy', nan):.2f}",
                              fmt=f"{metrics.get('eval_format_rate', nan):.2f}")
        if self.step % r.save_every == 0 or self.step == r.max_steps:
            self._checkpoint()

    # --- checkpoints -----------------------------------------------------------------------------------
    def _checkpoint(self) -> None:
        path, w = self.checkpoints.step_dir(self.step), self.workers
        wait_all([g.save(str(path / name)) for name, g in (("actor", w.actor), ("critic", w.critic)) if g is not None])
        crash_point("checkpoint", self.step)  # fault tests: the workers' state written, not yet committed
        self.checkpoints.commit(self.step, {"step": self.step, "version": self.version, "history": self.history,
                                            **({"extra": self.extra_state()} if self.extra_state else {})})

    def _restore(self) -> None:
        path, state = self.checkpoints.latest()
        w = self.workers
        wait_all([g.load(str(path / name)) for name, g in (("actor", w.actor), ("critic", w.critic)) if g is not None])
        self.step, self.history, self.resumed_extra = state["step"], state["history"], state.get("extra", {})
        self.version = state["version"] - 1
        self.sync_weights()  # the rollout starts from the checkpoint's weights, under the checkpoint's version
        log.info(f"resumed at step {self.step} from {path}")

    # --- the end -----------------------------------------------------------------------------------------
    def chat_template(self) -> str | None:
        """The Jinja template the prompts were rendered with; None: raw text (`data.chat_template=none`, or `auto`
        on a tokenizer without one). Multi-turn runs render with the template file or the tokenizer's own."""
        own = self.tokenizer.get_chat_template() if getattr(self.tokenizer, "chat_template", None) else None
        return self.prompts.template if isinstance(self.prompts, PromptFormat) else self.prompts.template or own

    def finish(self, **extras) -> RunResult:
        """Export the final model, plot, write summary.json and print the table."""
        final = self.out / FINAL_MODEL
        self.workers.actor.export_hf(str(final)).wait()
        complete_export(final, self.tokenizer, self.chat_template(), base_model=self.model_path)
        evals = [(h["step"], h["eval_accuracy"]) for h in self.history if "eval_accuracy" in h]
        formats = [(h["step"], h["eval_format_rate"]) for h in self.history if "eval_format_rate" in h]
        rewards = [(h["step"], h["reward"]) for h in self.history if "reward" in h]
        plot_series(self.out / "curves.png", [("mean reward (train samples)", rewards, {"alpha": 0.6}),
                                              ("held-out accuracy (greedy)", evals, {"marker": "o"}),
                                              ("held-out format rate", formats, {"marker": "x"})],
                    "GRPO step", ylim=(0, 1.05))
        summary = {"steps": self.step, "eval_accuracy_start": evals[0][1], "eval_accuracy_end": evals[-1][1],
                   "eval_format_rate_start": formats[0][1] if formats else None,
                   "eval_format_rate_end": formats[-1][1] if formats else None,
                   "reward_first": rewards[0][1] if rewards else None, "reward_last": rewards[-1][1] if rewards else None,
                   "output_dir": str(self.out)}
        (self.out / "summary.json").write_text(json.dumps({"summary": summary, "config": asdict(self.cfg)},
                                                          indent=1, default=str))
        table = closing_table([h for h in self.history if "eval_accuracy" in h])
        log.info(f"\n{table}\nplot: {self.out / 'curves.png'}   TensorBoard: tensorboard --logdir {self.out / 'tensorboard'}")
        return RunResult(summary=summary, history=self.history, extras=extras)


# the closing table's columns beyond the step: held-out accuracy and format rate, and the rollout-vs-trainer mismatch
# when the trainer recomputes logprobs (a column is shown when some row has it)
TABLE_COLUMNS = (("eval_accuracy", "eval_accuracy", ".3f"), ("eval_format_rate", "eval_format_rate", ".3f"),
                 ("mismatch/kl_k3", "mismatch_kl", ".2e"),
                 ("mismatch/masked_fraction", "masked", ".3f"))


def closing_table(rows: list[dict]) -> str:
    """`step` and each of `TABLE_COLUMNS` that a row has, one line per row ("-" where a row lacks it)."""
    columns = [c for c in TABLE_COLUMNS if any(c[0] in row for row in rows)]
    lines = ["  step" + "".join(f"  {title:>{len(title)}}" for _, title, _ in columns)]
    for row in rows:
        cells = [f"{format(row[key], fmt):>{len(title)}}" if key in row else f"{'-':>{len(title)}}"
                 for key, title, fmt in columns]
        lines.append(f"  {row['step']:>4}" + "".join(f"  {c}" for c in cells))
    return "\n".join(lines)
