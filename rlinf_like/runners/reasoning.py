"""Reasoning RL: data -> rollout -> reward -> (reference, critic) -> actor -> weight sync, step after step.

The placement decides the mode. Actor and rollout on the same devices: collocated, they take
turns (actor offloads while the rollout generates, then the reverse) and every step is
on-policy. On different devices: pipelined, the rollout generates the next `max_staleness`
batches with the weights it has while the actor trains; every sample carries the policy
version that made it, and the step log reports the staleness.

A run warm-starts the actor with SFT (so GRPO starts from non-zero reward), then trains with
the configured advantage estimator and loss (`gae` adds a critic: PPO). Checkpoints (actor state + runner state) every
`save_every` steps; `runner.resume=true` continues from the last one with the same data order.
"""

from __future__ import annotations

import json
import random
import time
from collections import deque
from dataclasses import asdict
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter
from tqdm import tqdm

from rlinf_like.algorithms import OUTCOME_ADVANTAGES, gae, masked_whiten, reinforce_pp_advantages
from rlinf_like.algorithms.losses import AGGREGATIONS, KL_ESTIMATORS, PolicyLossConfig
from rlinf_like.data.batch import Batch, build_rl_batch, build_sft_batch
from rlinf_like.data.tasks import ArithmeticSpec, Problem, arithmetic_problems, load_jsonl, split_train_test
from rlinf_like.hybrid_engines.fsdp import FSDPConfig
from rlinf_like.hybrid_engines.model_manager import OptimConfig
from rlinf_like.hybrid_engines.reshard import SyncPlan
from rlinf_like.models import load_tokenizer
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.actor_setup import actor_config, actor_replicas, check_actor_section
from rlinf_like.runners.common import Checkpoints, crash_point, plot_series, write_worker_pids
from rlinf_like.runners.config import COMPONENTS, ReasoningConfig
from rlinf_like.scheduler import Channel, Cluster, PlacementMode, connect_groups, wait_all
from rlinf_like.scheduler.dynamic import SCHEDULES
from rlinf_like.workers.actor.loss import LossConfig
from rlinf_like.workers.actor.worker import BACKENDS, ActorWorker, loss_weigh
from rlinf_like.workers.critic import CriticConfig, CriticWorker
from rlinf_like.workers.inference.worker import InferenceWorker
from rlinf_like.workers.reward.combine import check_reward_config
from rlinf_like.workers.reward.worker import RewardWorker
from rlinf_like.training.batch_resizer import BatchResizer
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, RolloutResult, SamplingParams
from rlinf_like.workers.rollout.engine import LOGPROB_SOURCES
from rlinf_like.workers.rollout.worker import RolloutWorker, gather_results
from rlinf_like.training.loop import LoopConfig, check_loop

CHECKPOINT = "checkpoint"
REFERENCE_MODEL = "reference_model"  # the warm-started policy, exported once: what the KL term pulls toward
REWARDS, CORRECT, VERSION = "rewards", "correct", "version"  # per-row columns only the driver reads
TOKEN_ADVANTAGES = ("reinforce_pp", "gae")
NONFINITE_POLICIES = ("skip", "stop")  # per-token rewards (outcome on the last token, optional KL penalty)


def check_config(cfg: ReasoningConfig) -> None:
    """Values a schema cannot check, failing before any worker starts and naming the key."""
    choices = {"algorithm.advantage": (cfg.algorithm.advantage, [*OUTCOME_ADVANTAGES.names(), *TOKEN_ADVANTAGES]),
               "algorithm.aggregation": (cfg.algorithm.aggregation, AGGREGATIONS.names()),
               "algorithm.kl_estimator": (cfg.algorithm.kl_estimator, KL_ESTIMATORS.names()),
               "task.kind": (cfg.task.kind, ["arithmetic", "jsonl"]),
               "rollout.engine": (cfg.rollout.engine, ["hf", "native", "sglang"]),
               "rollout.dtype": (cfg.rollout.dtype, ["float32", "bfloat16", "float16"]),
               "rollout.logprobs": (cfg.rollout.logprobs, list(LOGPROB_SOURCES)),
               "runner.nonfinite": (cfg.runner.nonfinite, list(NONFINITE_POLICIES)),
               "runner.schedule": (cfg.runner.schedule, list(SCHEDULES)),
               "actor.backend": (cfg.actor.backend, list(BACKENDS))}
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            raise ValueError(f"{key}={value!r} is not one of {allowed}")
    positive = {"runner.max_steps": cfg.runner.max_steps, "runner.prompts_per_step": cfg.runner.prompts_per_step,
                "algorithm.samples_per_prompt": cfg.algorithm.samples_per_prompt,
                "runner.max_new_tokens": cfg.runner.max_new_tokens}
    for key, value in positive.items():
        if value <= 0:
            raise ValueError(f"{key} must be > 0, got {value}")
    if cfg.algorithm.kl_in_reward and (cfg.algorithm.kl_beta <= 0 or cfg.algorithm.advantage not in TOKEN_ADVANTAGES):
        raise ValueError(f"algorithm.kl_in_reward needs algorithm.kl_beta > 0 and algorithm.advantage in "
                         f"{list(TOKEN_ADVANTAGES)} (per-token rewards); with grpo / rloo the KL is a loss term")
    if cfg.algorithm.is_correction_cap is not None and not cfg.algorithm.recompute_logprobs:
        raise ValueError("algorithm.is_correction_cap needs algorithm.recompute_logprobs=true")
    if cfg.runner.max_staleness < 0:
        raise ValueError(f"runner.max_staleness must be >= 0, got {cfg.runner.max_staleness}")
    if cfg.task.kind == "jsonl" and not (cfg.task.train_path and cfg.task.test_path):
        raise ValueError("task.kind=jsonl needs task.train_path and task.test_path")
    if cfg.runner.temperature <= 0:  # trainer logprobs are taken under the sampling temperature
        raise ValueError(f"runner.temperature must be > 0 for training (greedy has no logprobs to train on), "
                         f"got {cfg.runner.temperature}")
    warmup = cfg.algorithm.critic_warmup_steps
    if warmup < 0 or (warmup and cfg.algorithm.advantage != "gae"):
        raise ValueError(f"algorithm.critic_warmup_steps={warmup} needs to be >= 0, "
                         f"and > 0 only with algorithm.advantage=gae (the critic)")
    if cfg.rollout.logprobs == "rescored" and cfg.rollout.engine != "native":
        raise ValueError(f"rollout.logprobs=rescored needs rollout.engine=native; got {cfg.rollout.engine!r}")
    if not 0.0 <= cfg.runner.migrate_at < 1.0 or (cfg.runner.migrate_at and cfg.runner.schedule != "dynamic"):
        raise ValueError(f"runner.migrate_at={cfg.runner.migrate_at} must be in [0, 1), and > 0 only with "
                         f"runner.schedule=dynamic (got {cfg.runner.schedule!r})")
    check_reward_config(cfg.reward)
    check_loop(runner_loop(cfg), "runner")
    check_actor_section(cfg)


def runner_loop(cfg: ReasoningConfig) -> LoopConfig:
    """The actor's and critic's training loop from the runner and algorithm sections."""
    r, a = cfg.runner, cfg.algorithm
    return LoopConfig(a.mini_batches, r.micro_batch_size, a.epochs, r.seed, r.pack_sequences, r.max_batch_seqlen,
                      r.max_tokens_per_micro_batch)


def check_finite(metrics: dict[str, float], step: int, policy: str) -> str | None:
    """The trainers never apply a non-finite gradient (the manager skips that optimizer step); this
    decides whether the run goes on. Returns the warning to log, or raises under policy "stop"."""
    skipped = {k: v for k, v in metrics.items() if k in ("skipped", "critic_skipped") and v > 0}
    if not skipped:
        return None
    detail = ", ".join(f"{k}={metrics[k]:.4g}" for k in ("loss", "grad_norm", "value_loss", "critic_grad_norm")
                       if k in metrics)
    message = (f"step {step}: non-finite loss or gradient norm ({detail}); the affected optimizer steps were "
               f"skipped (fraction {skipped}), weights unchanged")
    if policy == "stop":
        raise RuntimeError(message + "; stopping (runner.nonfinite=stop); the last checkpoint is intact")
    return message


def check_batch_split(cfg: ReasoningConfig, world_sizes: dict[str, int]) -> None:
    """Every data-parallel rank must run the same number of micro-batches (each one is a collective
    under FSDP). By rows, a step's rows must split evenly over ranks and mini-batches; with a token
    budget the plan deals every rank the same count, so each mini-batch only needs a row per rank."""
    rows = cfg.runner.prompts_per_step * cfg.algorithm.samples_per_prompt
    minis = cfg.algorithm.mini_batches
    for component, world in world_sizes.items():
        if cfg.runner.max_tokens_per_micro_batch is not None:
            if rows < world * minis:
                raise ValueError(
                    f"runner.prompts_per_step x algorithm.samples_per_prompt = {rows} rows per step cannot give "
                    f"each of {component} ranks ({world}) a row in each of algorithm.mini_batches ({minis})")
        elif rows % (world * minis):
            raise ValueError(
                f"runner.prompts_per_step x algorithm.samples_per_prompt = {rows} rows per step do not divide by "
                f"{component} ranks ({world}) x algorithm.mini_batches ({minis}); "
                f"pick sizes whose product is a multiple of {world * minis} (or set runner.max_tokens_per_micro_batch)")


class ReasoningRunner:
    actor_worker: type[ActorWorker] = ActorWorker  # runners/dynamic_schedule.py swaps in the elastic actor

    def __init__(self, cfg: ReasoningConfig):
        check_config(cfg)
        self.cfg = cfg
        self.out = Path(cfg.runner.output_dir)
        self.checkpoints = Checkpoints(self.out / CHECKPOINT)
        self.out.mkdir(parents=True, exist_ok=True)
        self.sft_set, self.test_set, self.rl_pool = self._tasks()
        self.model_path = self._model_path()
        self.tokenizer = load_tokenizer(self.model_path)
        self.history: list[dict] = []
        self.step = 0
        self.version = 0
        self.critic: CriticWorker | None = None  # launched with algorithm.advantage=gae
        self.resizer: BatchResizer | None = None  # pipelined mode with a token budget
        self._reward_s = 0.0
        self._prepared: dict[str, float] = {}
        self._answers: dict[str, str] = {}  # request id -> answer, for results arriving on the channel

    # --- setup ------------------------------------------------------------------------------------------
    def _tasks(self) -> tuple[list[Problem], list[Problem], list[Problem]]:
        t = self.cfg.task
        if t.kind == "jsonl":
            train, test = load_jsonl(t.train_path), load_jsonl(t.test_path)
            return train, test, train
        spec = ArithmeticSpec(t.terms, t.max_operand, t.operators)
        sft, test = split_train_test(t.sft_problems, t.test_problems, t.seed, spec)
        held_out = {p.prompt for p in test}
        pool = [p for p in arithmetic_problems(20 * t.sft_problems, t.seed + 17, spec) if p.prompt not in held_out]
        return sft, test, pool

    def _model_path(self) -> str:
        m = self.cfg.model
        if m.path:
            return m.path
        spec = TinyModelSpec(arch=m.arch, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                             num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
                             init_std=m.init_std, seed=m.seed)
        return str(write_tiny_model(self.out / "init_model", spec))

    def _launch(self, cluster: Cluster) -> None:
        cfg, a = self.cfg, self.cfg.algorithm
        placement = cluster.place(cfg.cluster.component_placement, known_components=COMPONENTS)
        optional = {"reference": ("algorithm.kl_beta > 0", a.kl_beta > 0),
                     "critic": ("algorithm.advantage=gae", a.advantage == "gae")}
        needed = ["actor", "rollout", "reward"] + [c for c, (_, used) in optional.items() if used]
        missing = [c for c in needed if c not in placement.components]
        if missing:  # before any worker starts
            why = "".join(f" ({c}: with {optional[c][0]})" for c in missing if c in optional)
            raise ValueError(f"cluster.component_placement places no {missing}{why}; "
                             f"it places {sorted(placement.components)}")
        # the actor's rows split over its data-parallel replicas (TP x PP ranks of one replica share them)
        split = "actor" if cfg.actor.tp_size * cfg.actor.pp_size == 1 else "actor data-parallel"  # "... ranks (n)"
        replicas = {split: actor_replicas(cfg, placement["actor"].world_size)}
        if a.kl_beta > 0 and cfg.actor.backend == "megatron":  # the reference is split like the actor
            actor_replicas(cfg, placement["reference"].world_size, "reference")
        if "critic" in needed:
            replicas["critic"] = placement["critic"].world_size
        check_batch_split(cfg, replicas)
        print(placement.describe())
        self.collocated = placement.relation("actor", "rollout") is not PlacementMode.DISAGGREGATED
        loss_kl = 0.0 if a.kl_in_reward else a.kl_beta  # the KL goes into the reward or the loss, not both
        loss = LossConfig(PolicyLossConfig(a.clip_low, a.clip_high, a.dual_clip, a.aggregation), loss_kl,
                          a.kl_estimator, a.entropy_coef, a.is_correction_cap, cfg.runner.temperature)
        loop = runner_loop(cfg)
        actor_cfg = actor_config(cfg, self.model_path, loss, loop)
        self.actor = self.actor_worker.create_group(actor_cfg).launch(cluster, placement, "actor")
        self.actor_dp = self.actor.data_parallel().wait()  # per actor rank: its replica's rows
        self.critic = None
        if a.advantage == "gae":
            critic_cfg = CriticConfig(self.model_path, FSDPConfig(optim=OptimConfig(lr=a.critic_lr)), loop, a.value_clip)
            self.critic = CriticWorker.create_group(critic_cfg).launch(cluster, placement, "critic")
        rollout_cfg = RolloutConfig(engine=cfg.rollout.engine, model_path=self.model_path,
                                    max_batch_size=cfg.rollout.max_batch_size, tp_size=cfg.rollout.tp_size,
                                    dtype=cfg.rollout.dtype, logprobs=cfg.rollout.logprobs, seed=cfg.runner.seed)
        self.rollout = RolloutWorker.create_group(rollout_cfg).launch(cluster, placement, "rollout")
        self.reward = RewardWorker.create_group(self.model_path, cfg.reward).launch(
            cluster, placement, "reward", init_process_group=False)
        self.reference = None  # launched by `_launch_reference` once the policy RL starts from exists
        self._placement, self._actor_cfg = placement, actor_cfg
        connect_groups(self.actor, self.rollout, "weights")
        [src] = self.actor.on_ranks(0).weight_layouts().wait()
        [dst] = self.rollout.on_ranks(0).weight_layouts().wait()
        plan = SyncPlan.build(src, dst, "actor", "rollout")
        wait_all([self.actor.connect_weights("weights", plan), self.rollout.connect_weights("weights", plan)])
        if not self.collocated and cfg.runner.max_tokens_per_micro_batch is not None:
            self._start_resizer(cluster, loop, loss)
        self._write_pids()

    def _write_pids(self) -> None:
        write_worker_pids(self.out, {"actor": self.actor, "critic": self.critic, "rollout": self.rollout,
                                     "reward": self.reward, "reference": self.reference})

    def _launch_reference(self, cluster: Cluster) -> None:
        """The KL reference (`algorithm.kl_beta > 0`): the policy RL starts from, frozen, i.e. the
        warm-started actor as `warm_start` exported it (the initial model when there is no warm start),
        on the actor's backend so its logprobs are the actor's own numerics: the first step's KL is 0."""
        cfg = self.cfg
        if cfg.algorithm.kl_beta <= 0:
            return
        start = self.out / REFERENCE_MODEL if cfg.runner.sft_steps > 0 else Path(self.model_path)
        if not (start / "config.json").exists():
            raise FileNotFoundError(f"the KL reference model {start} is missing: it is exported after the SFT "
                                    f"warm-start (this run directory predates that, or was cut short before it)")
        megatron = self._actor_cfg.megatron if cfg.actor.backend == "megatron" else None
        self.reference = InferenceWorker.create_group(
            str(start), cfg.runner.micro_batch_size, cfg.runner.temperature, cfg.runner.pack_sequences,
            cfg.runner.max_batch_seqlen, megatron).launch(cluster, self._placement, "reference")
        self._write_pids()

    def _start_resizer(self, cluster: Cluster, loop: LoopConfig, loss: LossConfig) -> None:
        """Pipelined mode with a token budget: the rollout streams each finished group onto a channel;
        the resizer scores them into pieces, gathers global batches of exactly one step's rows, runs
        `_prepare` (advantages, whitening) on each whole batch, and plans each actor rank's
        token-budget micro-batches."""
        rows = self.cfg.runner.prompts_per_step * self.cfg.algorithm.samples_per_prompt
        self.results = Channel.create(cluster.scoped_name("rollout-results"), RolloutResult)
        pieces = (self._scored_batch([res], [self._answers.pop(res.request_id)]) for res in self.results)
        self.resizer = BatchResizer(pieces, rows, [self._prepare], world_size=self.actor_dp[0].size, loop=loop,
                                    weigh=loss_weigh(loss))
        self._global_batches = self.resizer.global_batches()
        print(f"pipelined with a token budget: rollout groups stream through a BatchResizer into global "
              f"batches of {rows} rows, {loop.max_tokens_per_micro_batch} tokens per micro-batch")

    # --- phases -----------------------------------------------------------------------------------------
    def _trainers(self) -> list:
        """The trained groups that give their devices to the rollout in collocated mode."""
        return [self.actor] + ([self.critic] if self.critic is not None else [])

    def _sync_weights(self) -> None:
        self.version += 1
        wait_all([self.actor.publish_weights(self.version), self.rollout.apply_weights(self.version)])

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text).input_ids

    def warm_start(self) -> None:
        r = self.cfg.runner
        if r.sft_steps <= 0:
            return
        rng = random.Random(r.seed)
        self.actor.set_lr(r.sft_lr).wait()
        eos = self.tokenizer.eos_token_id
        for _ in tqdm(range(r.sft_steps), desc="SFT warm-start", unit="step"):
            items = [rng.choice(self.sft_set) for _ in range(r.sft_batch_size)]
            batch = build_sft_batch([self._encode(p.prompt) for p in items],
                                    [self._encode(p.solution) + [eos] for p in items])
            self.actor.sft_step(batch).wait()
        self.actor.set_lr(self.cfg.algorithm.lr).wait()
        self._sync_weights()
        if self.cfg.algorithm.kl_beta > 0:
            self.actor.export_hf(str(self.out / REFERENCE_MODEL)).wait()

    def _requests(self, step: int) -> tuple[list[RolloutRequest], list[Problem]]:
        r = self.cfg.runner
        rng = random.Random(r.seed * 1_000_003 + step)  # data order depends on the step only: resumable
        problems = [rng.choice(self.rl_pool) for _ in range(r.prompts_per_step)]
        params = [SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                                 seed=rng.getrandbits(31)) for _ in problems]
        reqs = [RolloutRequest(f"s{step}-{i}", self._encode(p.prompt), sp, self.cfg.algorithm.samples_per_prompt)
                for i, (p, sp) in enumerate(zip(problems, params))]
        return reqs, problems

    def evaluate(self) -> float:
        """Greedy accuracy on the held-out set."""
        greedy = SamplingParams(max_new_tokens=self.cfg.runner.max_new_tokens, temperature=0.0)
        reqs = [RolloutRequest(f"eval-{i}", self._encode(p.prompt), greedy) for i, p in enumerate(self.test_set)]
        results = gather_results(self.rollout.generate(reqs).wait(), reqs)
        scores = self.reward.score(results, [p.answer for p in self.test_set]).wait()[0]
        return sum(group[0]["correct"] for group in scores) / len(scores)

    def _scored_batch(self, results, answers: list[str]) -> Batch:
        """The RL batch of `results` (one row per sample), with per-row columns the driver reads later:
        `rewards`, `correct` and the policy `version` that generated the row."""
        start = time.perf_counter()
        scores = self.reward.score(results, answers).wait()[0]
        rows = [(res.prompt_ids, resp, lp) for res in results for resp, lp in zip(res.response_ids, res.logprobs)]
        batch = build_rl_batch(*zip(*rows), [0.0] * len(rows), pad_id=self.tokenizer.pad_token_id or 0)
        batch[REWARDS] = torch.tensor([s["reward"] for group in scores for s in group], dtype=torch.float32)
        batch[CORRECT] = torch.tensor([float(s["correct"]) for group in scores for s in group])
        batch[VERSION] = torch.tensor([float(res.version) for res in results for _ in res.response_ids])
        self._reward_s += time.perf_counter() - start
        return batch

    def _prepare(self, batch: Batch) -> Batch:
        """Everything the update needs on a whole batch (advantages use every sample of a group):
        reference logprobs, critic values, advantages, recomputed logprobs. Timings and the advantage
        estimator's extras go to `self._prepared`. In resizer mode this is the resizer's hook."""
        a, times = self.cfg.algorithm, {}
        if self.reference is not None:
            start = time.perf_counter()
            batch["ref_logprobs"] = torch.cat(self.reference.compute_logprobs(batch).wait())
            times["reference_s"] = time.perf_counter() - start
        start = time.perf_counter()
        if self.collocated:
            wait_all([w.onload() for w in self._trainers()])
        if self.critic is not None:
            batch["old_values"] = torch.cat(self.critic.compute_values(batch).wait())
        rewards = batch[REWARDS].reshape(-1, a.samples_per_prompt)
        batch["advantages"], extra = self._advantages(rewards, batch)
        times.update(extra)
        if a.recompute_logprobs:  # the trainer's own numerics for pi_old (ranks return their rows in order)
            batch["recomputed_logprobs"] = torch.cat(self.actor.compute_logprobs(batch).wait())
            gap = (batch["recomputed_logprobs"] - batch["old_logprobs"]).abs() * batch["response_mask"]
            times["rollout_trainer_logprob_gap"] = float(gap.sum() / batch["response_mask"].sum())
        times["prepare_s"] = time.perf_counter() - start
        self._prepared = times
        return batch

    def _train_on(self, batch: Batch) -> dict[str, float]:
        """Update on a prepared batch; the step's metrics."""
        info = {key: batch.pop(key) for key in (REWARDS, CORRECT, VERSION)}  # driver-only columns
        start = time.perf_counter()
        metrics = self._update(batch)
        train_s = self._prepared.pop("prepare_s") + time.perf_counter() - start
        warning = check_finite(metrics, self.step + 1, self.cfg.runner.nonfinite)
        if warning:
            tqdm.write(warning)
        reward_s, self._reward_s = self._reward_s, 0.0
        return {**metrics, **self._prepared, "train_s": train_s, "reward_s": reward_s, "reward": float(info[REWARDS].mean()),
                "train_accuracy": float(info[CORRECT].mean()),
                "staleness": float(self.version - info[VERSION].min()),
                "response_tokens": float(batch["response_mask"].sum() / len(info[REWARDS]))}

    def _update(self, batch) -> dict[str, float]:
        """One update of the trained models. During critic warmup (the first
        `algorithm.critic_warmup_steps` steps) only the value model trains: the actor is left as it is."""
        warmup = self.critic is not None and self.step < self.cfg.algorithm.critic_warmup_steps
        metrics = {} if warmup else self._train_actor(batch)
        if self.critic is not None:
            metrics.update(self.critic.train_step(batch).wait()[0], critic_warmup=float(warmup))
        return metrics

    def _train_actor(self, batch) -> dict[str, float]:
        """Every rank gets the batch and plans its micro-batches; with the resizer, the driver plans
        and sends each rank its own (the same plan: `BatchResizer.rank_steps` is `plan_steps`)."""
        if self.resizer is None:
            return self.actor.train_step(batch).wait()[0]
        step = self.actor.on_ranks(0).status().wait()[0]["step"]  # the shuffle's seed, as in train_epochs
        calls = [self.actor.on_ranks(r).train_micro_batches(self.resizer.rank_steps(batch, dp.rank, step))
                 for r, dp in enumerate(self.actor_dp)]
        return [call.wait()[0] for call in calls][0]

    def _advantages(self, rewards: torch.Tensor, batch) -> tuple[torch.Tensor, dict[str, float]]:
        """Per-token advantages [rows, tokens-1] from the [prompts, samples] outcome rewards; for gae also
        the critic's regression targets (batch["returns"])."""
        a, mask, extra = self.cfg.algorithm, batch["response_mask"], {}
        if a.advantage not in TOKEN_ADVANTAGES:
            estimator = OUTCOME_ADVANTAGES.get(a.advantage)
            per_seq = estimator(rewards, scale_by_std=a.scale_by_std) if a.advantage == "grpo" else estimator(rewards)
            return per_seq.reshape(-1, 1) * mask, extra
        # token rewards: the outcome reward on each response's last token, minus a per-token KL penalty
        token_rewards = torch.zeros_like(mask)
        last = mask.shape[1] - 1 - mask.flip(1).argmax(1)
        token_rewards[torch.arange(mask.shape[0]), last] = rewards.reshape(-1)
        if a.kl_in_reward:
            kl = KL_ESTIMATORS.get(a.kl_estimator)(batch["old_logprobs"], batch["ref_logprobs"]) * mask
            token_rewards = token_rewards - a.kl_beta * kl
            extra["kl_penalty"] = float(kl.sum() / mask.sum())
        if a.advantage == "reinforce_pp":
            return reinforce_pp_advantages(token_rewards, mask), extra
        values = batch["old_values"]
        advantages, batch["returns"] = gae(token_rewards, values, mask, a.gamma, a.lam)
        extra["value_mean"] = float((values * mask).sum() / mask.sum())
        return masked_whiten(advantages, mask), extra

    # --- the loop ---------------------------------------------------------------------------------------
    def run(self) -> dict:
        r = self.cfg.runner
        with Cluster(self.cfg.cluster) as cluster:
            self._launch(cluster)
            if r.resume and self.checkpoints.exists():
                self._restore()
            else:
                self.warm_start()
                self.history.append({"step": 0, "eval_accuracy": self.evaluate()})
            self._launch_reference(cluster)
            writer = SummaryWriter(str(self.out / "tensorboard"))
            pending: deque = deque()
            bar = tqdm(range(self.step, r.max_steps), desc="GRPO", unit="step", initial=self.step, total=r.max_steps)
            clock = self.history[-1].get("elapsed_s", 0.0)  # GRPO seconds, without evals and checkpoints
            for step in bar:
                step_start = time.perf_counter()
                metrics = self._rollout_and_train(step, pending)
                self._sync_weights()
                self.step = step + 1
                clock += time.perf_counter() - step_start
                metrics["elapsed_s"] = clock
                if self.step % r.eval_every == 0 or self.step == r.max_steps:
                    metrics["eval_accuracy"] = self.evaluate()
                for k, v in metrics.items():
                    writer.add_scalar(f"grpo/{k}", v, self.step)
                self.history.append({"step": self.step, **metrics})
                bar.set_postfix(reward=f"{metrics['reward']:.2f}",
                                acc=f"{metrics.get('eval_accuracy', float('nan')):.2f}")
                if self.step % r.save_every == 0 or self.step == r.max_steps:
                    self._checkpoint()
            writer.close()
            if self.resizer is not None:
                self.results.destroy()
            self.actor.export_hf(str(self.out / "final_model")).wait()
        return self._summary()

    def _rollout_and_train(self, step: int, pending: deque) -> dict[str, float]:
        """One step up to (not including) the weight sync; the rollout is resident again on return."""
        r = self.cfg.runner
        lead = 0 if self.collocated else r.max_staleness
        while len(pending) <= lead and step + len(pending) < r.max_steps:
            reqs, problems = self._requests(step + len(pending))
            if self.collocated:
                wait_all([w.offload() for w in self._trainers()])
                self.rollout.onload().wait()
            start = time.perf_counter()
            if self.resizer is None:
                handle = self.rollout.generate(reqs)
            else:
                self._answers.update((q.request_id, p.answer) for q, p in zip(reqs, problems))
                handle = self.rollout.generate_to(self.results.name, reqs)
            pending.append((handle, reqs, problems, start))
        handle, reqs, problems, start = pending.popleft()
        outputs = handle.wait()
        rollout_s = time.perf_counter() - start
        if self.resizer is None:
            results = gather_results(outputs, reqs)
            if self.collocated:
                self.rollout.offload().wait()
            batch = self._prepare(self._scored_batch(results, [p.answer for p in problems]))
        else:  # the step's groups are on the channel: one global batch of its rows, prepared
            batch = next(self._global_batches)
        tokens = float(batch["response_mask"].sum())
        metrics = self._train_on(batch)
        metrics.update(rollout_s=rollout_s, rollout_tokens_per_s=tokens / max(rollout_s, 1e-9))
        if self.collocated:
            self.rollout.onload().wait()
        return metrics

    # --- checkpoints ------------------------------------------------------------------------------------
    def _checkpoint(self) -> None:
        path = self.checkpoints.step_dir(self.step)
        wait_all([self.actor.save(str(path / "actor"))]
                 + ([self.critic.save(str(path / "critic"))] if self.critic is not None else []))
        crash_point("checkpoint", self.step)  # fault tests: the workers' state written, not yet committed
        self.checkpoints.commit(self.step, {"step": self.step, "version": self.version, "history": self.history})

    def _restore(self) -> None:
        path, state = self.checkpoints.latest()
        wait_all([self.actor.load(str(path / "actor"))]
                 + ([self.critic.load(str(path / "critic"))] if self.critic is not None else []))
        self.step, self.version, self.history = state["step"], state["version"], state["history"]
        self._sync_weights()  # the rollout starts from the checkpoint's weights
        print(f"resumed at step {self.step} from {path}")

    def _summary(self) -> dict:
        evals = [(h["step"], h["eval_accuracy"]) for h in self.history if "eval_accuracy" in h]
        rewards = [(h["step"], h["reward"]) for h in self.history if "reward" in h]
        plot_series(self.out / "curves.png", [("mean reward (train samples)", rewards, {"alpha": 0.6}),
                                              ("held-out accuracy (greedy)", evals, {"marker": "o"})],
                    "GRPO step", ylim=(0, 1.05))
        summary = {"steps": self.step, "eval_accuracy_start": evals[0][1], "eval_accuracy_end": evals[-1][1],
                   "reward_first": rewards[0][1] if rewards else None, "reward_last": rewards[-1][1] if rewards else None,
                   "output_dir": str(self.out)}
        (self.out / "summary.json").write_text(json.dumps({"summary": summary, "config": asdict(self.cfg)},
                                                          indent=1, default=str))
        print("\n  step  eval_accuracy")
        for step, acc in evals:
            print(f"  {step:>4}  {acc:.3f}")
        print(f"plot: {self.out / 'curves.png'}   TensorBoard: tensorboard --logdir {self.out / 'tensorboard'}")
        return summary
