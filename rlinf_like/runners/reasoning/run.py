"""What every reasoning schedule shares around its loop: the run directory, data, tokenizer, workers,
SFT warm-start, evaluation, weight sync, metrics, checkpoints and the closing summary. A schedule opens
a `ReasoningRun`, iterates `run.steps()`, calls the phases, and ends each step with `run.end_step`.
What the run writes for people to read (run.log, samples.jsonl, TensorBoard text) is `run_files.py`'s.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tqdm import tqdm

from rlinf_like.algorithms import build_estimator
from rlinf_like.data.batch import build_sft_batch
from rlinf_like.data.prompts import PromptFormat
from rlinf_like.data.sources import Tasks, load_tasks
from rlinf_like.models import load_tokenizer
from rlinf_like.models.export import complete_export
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.reasoning.checks import check_config, check_context, check_finite
from rlinf_like.runners.common import plot_series
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.reasoning.launch import launch_reference, launch_workers, plan_before_start, precision_choice
from rlinf_like.runners.reasoning.perf import StepPerf
from rlinf_like.runners.reasoning.agent_format import AgentFormat, episode_metrics, task_row
from rlinf_like.runners.reasoning.phases import eval_metrics, own_group, score_groups
from rlinf_like.runners.run_record import CHECKPOINT, RunRecord
from rlinf_like.runtime import Cluster, GroupResult, Placement, WorkerDiedError, wait_all
from rlinf_like.workers.actor.worker import ActorWorker
from rlinf_like.workers.rollout import RolloutRequest, SamplingParams
from rlinf_like.workers.rollout.worker import gather_results
from rlinf_like.runners.reasoning.run_files import (Generated, RunLog, SampleLog, earlier_attempts, memory_metrics,
                                          progress_postfix)

log = logging.getLogger(__name__)
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
class ServedRollout(Protocol):
    """A rollout serving continuously, as the run reaches it (`ReasoningRun.serve_through`)."""

    def generate(self, requests: list[RolloutRequest]) -> list: ...

    def receive_weights(self, version: int) -> GroupResult: ...

    def state(self) -> dict: ...

    def restore(self, state: dict) -> None: ...


@dataclass
class RunResult:
    summary: dict
    history: list[dict]
    extras: dict = field(default_factory=dict)  # what a schedule reports beyond the history


class ReasoningRun(RunRecord):
    """Use as a context manager: entering starts the cluster and the workers and resumes (or warm-starts and
    evaluates); leaving stops the cluster. Its history, clock, trackers, checkpoints and summary.json are a
    `RunRecord`'s, as the embodied runner's are."""

    def __init__(self, cfg: ReasoningConfig, actor_worker: type[ActorWorker] = ActorWorker,
                 check_placement: Callable[[Placement], None] | None = None, cluster: Cluster | None = None):
        """`actor_worker` and `check_placement` are a schedule's: its actor class, and what it needs of the
        placement (checked before any worker starts). `cluster`: a running one to launch on (its Ray stays up after
        the run, which ends only its own workers and channels); None starts one from `cfg.cluster`."""
        self._borrowed = cluster
        check_config(cfg)
        super().__init__(cfg, Path(cfg.runner.output_dir))
        self.run_log = RunLog(self.out)  # the driver's log lines, until __exit__
        try:
            self._setup(cfg, actor_worker, check_placement)
        except BaseException:
            self.run_log.close()
            raise

    def _setup(self, cfg: ReasoningConfig, actor_worker: type[ActorWorker],
               check_placement: Callable[[Placement], None] | None) -> None:
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
        self.step = 0  # optimizer steps done
        self.version = 0  # the weights' version the rollout holds
        self.sync_metrics: dict[str, float] = {}  # the last weight sync's bytes and seconds
        self.server: ServedRollout | None = None  # set by `serve_through` (a rollout that serves continuously)
        self._resumed_server_state: dict = {}  # what the checkpoint resumed from saved of the server
        self.last_eval: dict[str, float] = {}  # the latest held-out evaluation (the progress bar shows it)

    def longest_prompt(self, sample: int = 512) -> int | None:
        """Tokens of the longest prompt among the first `sample` RL and test problems (what sizes the rollout's
        KV cache; a longer one later still runs). None for multi-turn runs, whose context grows turn by turn."""
        if self.cfg.agent.multi_turn:
            return None
        problems = list(self.tasks.pool[:sample]) + list(self.tasks.test[:sample])
        return max((len(self.prompts.prompt_ids(p)) for p in problems), default=0)

    # --- start and stop ------------------------------------------------------------------------------
    def __enter__(self) -> ReasoningRun:
        plan_before_start(self.cfg, self.estimator, self.check_placement)
        longest = self.longest_prompt()
        check_context(self.cfg, longest)
        note = earlier_attempts(self.out / "tensorboard")
        if note and self.cfg.logger.tensorboard:
            log.info(note)
        self.open_trackers()
        self.samples = SampleLog(self.out, self.trackers, lambda ids: self.tokenizer.decode(ids))
        try:
            self.cluster = (self._borrowed.scope() if self._borrowed else Cluster(self.cfg.cluster)).__enter__()
        except BaseException:
            self._close_files()
            raise
        try:
            self.workers = launch_workers(self.cfg, self.cluster, self.model_path, self.estimator, self.out,
                                          self.actor_worker, self.check_placement, longest)
            self.perf = self._measure_limit()
            if self.can_resume(self.cfg.runner.resume):
                self._restore()
            else:
                sft = self._warm_start()
                evaluated = self.evaluate()
                self.track("grpo", evaluated, 0)  # the curves' first point
                self.history.append({"step": 0, **sft, **evaluated})
            start = self.out / REFERENCE_MODEL if self.cfg.runner.sft_steps > 0 else Path(self.model_path)
            launch_reference(self.cfg, self.cluster, self.workers, start, self.out)
        except BaseException:
            self.cluster.__exit__(None, None, None)
            self._close_files()
            raise
        self.last_eval = next((h for h in reversed(self.history) if "eval_accuracy" in h), {})
        return self

    def __exit__(self, *exc) -> None:
        if isinstance(exc[1], WorkerDiedError):  # the steps done since the checkpoint: what a restart replays
            exc[1].run_step = self.step
        try:
            self.cluster.__exit__(*exc)
        finally:
            self._close_files()

    def _measure_limit(self) -> StepPerf:
        """What each step's MFU is measured against: the host's matmul peak in the actor's precision."""
        w = self.workers
        kind = w.placement["actor"].device_kind
        perf = StepPerf.of_run(self.cfg, self.model_path, precision_choice(self.cfg, kind)[0], kind,
                               w.actor.world_size, w.rollout.world_size,
                               shared_train=w.actor.on_ranks(0).shares_prompts().wait()[0],
                               reference_in_actor=w.reference_in_actor)
        log.info(perf.peak.describe() if perf.peak else "no matmul peak for these devices: MFU is not reported")
        return perf

    def _close_files(self) -> None:
        self.close_trackers()
        self.run_log.close()

    def _warm_start(self) -> dict[str, float]:
        """SFT steps; each step's loss and grad norm go to the trackers as `sft/*` (x: the SFT step). Returns the
        last step's loss for the history's step-0 row (`sft_loss`)."""
        r, w = self.cfg.runner, self.workers
        if r.sft_steps <= 0:
            return {}
        rng = random.Random(r.seed)
        self.prompts.prepare_sft(self.tasks.sft)  # what must be computed before the first batch
        w.actor.set_lr(r.sft_lr).wait()
        metrics: dict[str, float] = {}
        for i in tqdm(range(r.sft_steps), desc="SFT warm-start", unit="step"):
            items = [rng.choice(self.tasks.sft) for _ in range(r.sft_batch_size)]
            rows = [self.prompts.sft_ids(p) for p in items]  # (prompt, target[, target mask: multi-turn])
            batch = build_sft_batch([r[0] for r in rows], [r[1] for r in rows],
                                    target_masks=[r[2] for r in rows] if len(rows[0]) == 3 else None)
            metrics = w.actor.sft_step(batch).wait()[0]
            self.trackers.log({f"sft/{k}": v for k, v in metrics.items() if k in ("loss", "grad_norm")}, i + 1)
        w.actor.set_lr(self.cfg.algorithm.lr).wait()
        self.sync_weights()
        if self.cfg.algorithm.kl_beta > 0 and not w.reference_in_actor:
            w.actor.export_hf(str(self.out / REFERENCE_MODEL)).wait()
        log.info(f"SFT warm-start: {r.sft_steps} steps, last loss {metrics.get('loss', float('nan')):.4f}")
        return {"sft_loss": metrics["loss"]} if "loss" in metrics else {}

    # --- used by every schedule ------------------------------------------------------------------------
    def sync_weights(self) -> None:
        """The actor's weights to the rollout, as the next version."""
        self.version += 1
        start = time.perf_counter()
        receiving = self.workers.rollout.apply_weights(self.version) if self.server is None \
            else self.server.receive_weights(self.version)
        sent, _ = wait_all([self.workers.actor.publish_weights(self.version), receiving])
        # what the step's sync moved (under LoRA, after the first round: the adapted weights only)
        self.sync_metrics = {"sync_bytes": float(sum(sent)), "sync_s": time.perf_counter() - start}

    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy and format rate on the held-out set (`eval_accuracy`, `eval_format_rate`); the first few
        held-out generations go to samples.jsonl (kind `eval`)."""
        w, test = self.workers, self.tasks.test
        greedy = SamplingParams(max_new_tokens=self.cfg.runner.max_new_tokens, temperature=0.0)
        reqs = [RolloutRequest(f"eval-{i}", self.prompts.prompt_ids(p), greedy, row=task_row(self.cfg, p))
                for i, p in enumerate(test)]
        results = self.generate(reqs)
        if self.cfg.agent.multi_turn:  # what the agent does, for people: the first held-out episode
            log.info(f"held-out episode at step {self.step}:\n{self.prompts.trajectory(results[0])}")
        groups = score_groups(w, results, test)
        self.samples.record(self.step, "eval", Generated(results=results, problems=test, scores=groups))
        held_out = eval_metrics(groups)
        self.own_tags.update(k for k in held_out if own_group(k))
        return {**held_out,
                **{f"eval_{k}": v for k, v in episode_metrics(results).items()}}

    def generate(self, requests: list[RolloutRequest]) -> list:
        if self.server is not None:
            return self.server.generate(requests)
        return gather_results(self.workers.rollout.generate(requests).wait(), requests)

    def serve_through(self, server: ServedRollout) -> None:
        """From now on the rollout serves continuously (the async schedule): evaluation requests and new weights go
        to its running serve loop (calls would queue behind it), and the server's state goes into each checkpoint;
        a resumed run hands the server what the checkpoint saved of it."""
        self.server = server
        if self._resumed_server_state:
            server.restore(self._resumed_server_state)

    def steps(self) -> Iterator[int]:
        """The steps left to run (0-based), with a progress bar."""
        r = self.cfg.runner
        self._bar = tqdm(range(self.step, r.max_steps), desc="GRPO", unit="step", initial=self.step,
                         total=r.max_steps)
        for step in self._bar:
            self._step_start = time.perf_counter()
            yield step

    def end_step(self, step: int, metrics: dict[str, float], generated: Generated | None = None) -> None:
        """After the step's weight sync: time it, evaluate when due, log, checkpoint when due. `generated`: the
        step's samples, a few of which go to samples.jsonl (kind `train`)."""
        r = self.cfg.runner
        step_s = time.perf_counter() - self._step_start
        self.clock += step_s
        self.step = step + 1
        warning = check_finite(metrics, self.step, r.nonfinite)
        if warning:
            log.warning(warning)
        metrics["elapsed_s"], metrics["step_s"] = self.clock, step_s
        metrics.update(self.sync_metrics)
        if generated is not None:
            self.samples.record(self.step, "train", generated)
        if self.step % r.eval_every == 0 or self.step == r.max_steps:
            self.last_eval = self.evaluate()
            metrics.update(self.last_eval)
        # memory goes to the trackers only: like timings it differs between runs, and the history is compared across
        # runs (backends, schedules, resumes) key by key
        perf = {} if generated is None else self.perf.step(generated.results, metrics.get("train_s"),
                                                            metrics.get("rollout_s"))
        self.record("step", self.step, metrics, "grpo", self.step, {**memory_metrics(self.workers.all_groups()), **perf})
        self._bar.set_postfix(progress_postfix(metrics, self.last_eval))
        if self.step % r.save_every == 0 or self.step == r.max_steps:
            self._checkpoint()

    # --- checkpoints -----------------------------------------------------------------------------------
    def _trained(self) -> dict:
        return {"actor": self.workers.actor, "critic": self.workers.critic}

    def _checkpoint(self) -> None:
        self.save(self.step, self._trained(), {"step": self.step, "version": self.version,
                                               **({"extra": self.server.state()} if self.server else {})})

    def _restore(self) -> None:
        path, state = self.latest()
        self.load(path, self._trained())
        self.step, self._resumed_server_state = state["step"], state.get("extra", {})
        self.version = state["version"] - 1
        self.sync_weights()  # the rollout starts from the checkpoint's weights, under the checkpoint's version
        log.info(f"resumed at step {self.step} from {path}")
        self.track_faults(self.step)

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
        grouped = [(f"held-out {tag}", series, {"marker": "."}) for tag in sorted(self.own_tags)  # IFEval's four
                   if (series := [(h["step"], h[tag]) for h in self.history if tag in h]) not in (evals, formats)]
        plot_series(self.out / "curves.png", [("mean reward (train samples)", rewards, {"alpha": 0.6}),
                                              ("held-out accuracy (greedy)", evals, {"marker": "o"}),
                                              ("held-out format rate", formats, {"marker": "x"}), *grouped],
                    "GRPO step", ylim=(0, 1.05))
        summary = {"steps": self.step, "eval_accuracy_start": evals[0][1], "eval_accuracy_end": evals[-1][1],
                   "eval_format_rate_start": formats[0][1] if formats else None,
                   "eval_format_rate_end": formats[-1][1] if formats else None,
                   "reward_first": rewards[0][1] if rewards else None, "reward_last": rewards[-1][1] if rewards else None,
                   "output_dir": str(self.out)}
        best = max(evals, key=lambda e: e[1])  # the earliest of the best
        summary["best_step"], summary["best_eval_accuracy"] = best
        self.write_summary(summary)
        kept = self.checkpoints.latest()[0].name if self.checkpoints.exists() else None
        table = closing_table(self.history)
        log.info(f"\n{table}\nbest held-out accuracy {best[1]:.3f} at step {best[0]}; "
                 f"{FINAL_MODEL}/ is step {self.step}"
                 + (f", and the one checkpoint kept is {CHECKPOINT}/{kept}" if kept else "")
                 + f"\nplot: {self.out / 'curves.png'}   TensorBoard: tensorboard --logdir {self.out / 'tensorboard'}"
                 f"   samples: {self.out / 'samples.jsonl'}   log: {self.run_log.path}"
                 + (f"\n{self.perf.summary()}" if self.perf.seen else ""))
        return RunResult(summary=summary, history=self.history, extras=extras)


# the closing table's columns beyond the step: held-out accuracy and format rate (IFEval's prompt-level loose and
# strict scores under reward.fn=ifeval, beside its instruction-level ones); the training reward, mean response
# length and seconds per step, each averaged over the steps since the row above ("mean_" titles); the rollout-vs-trainer
# mismatch when the trainer recomputes logprobs. A column is shown when some row has it.
TABLE_COLUMNS = (("eval_accuracy", "eval_accuracy", ".3f"), ("eval_format_rate", "eval_format_rate", ".3f"),
                 ("ifeval/inst_strict", "inst_strict", ".3f"), ("ifeval/inst_loose", "inst_loose", ".3f"),
                 ("reward", "mean_reward", ".3f"), ("response_tokens", "mean_resp_len", ".1f"),
                 ("step_s", "mean_step_s", ".2f"),
                 ("mismatch/kl_k3", "mismatch_kl", ".2e"),
                 ("mismatch/masked_fraction", "masked", ".3f"))
AVERAGED = ("reward", "response_tokens", "step_s")


def closing_table(history: list[dict]) -> str:
    """One line per evaluated row of `history` (those with `eval_accuracy`): `step` and each of `TABLE_COLUMNS`
    ("-" where a row lacks it); the `AVERAGED` keys are the mean over the rows since the previous evaluated one."""
    rows, window = [], []
    for row in history:
        window.append(row)
        if "eval_accuracy" not in row:
            continue
        means = {key: sum(values) / len(values) for key in AVERAGED
                 if (values := [h[key] for h in window if key in h])}
        rows.append({**{k: v for k, v in row.items() if k not in AVERAGED}, **means})
        window = []
    columns = [c for c in TABLE_COLUMNS if any(c[0] in row for row in rows)]
    lines = ["  step" + "".join(f"  {title:>{len(title)}}" for _, title, _ in columns)]
    for row in rows:
        cells = [f"{format(row[key], fmt):>{len(title)}}" if key in row else f"{'-':>{len(title)}}"
                 for key, title, fmt in columns]
        lines.append(f"  {row['step']:>4}" + "".join(f"  {c}" for c in cells))
    return "\n".join(lines)
