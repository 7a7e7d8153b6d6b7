"""Placing and launching the reasoning workers: one `Workers` record the schedules pass to the phases."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from rlinf_like.algorithms.advantage_estimators import AdvantageEstimator
from rlinf_like.hybrid_engines.fsdp import FSDPConfig
from rlinf_like.hybrid_engines.fsdp.lora import check_targets_of
from rlinf_like.hybrid_engines.model_manager import OptimConfig
from rlinf_like.runners.reasoning import memory
from rlinf_like.runners.reasoning.actor_setup import (actor_config, actor_loop, actor_precision, actor_replicas,
                                                       reference_in_actor)
from rlinf_like.runners.reasoning.agent_format import chat_template_text
from rlinf_like.runners.reasoning.checks import check_batch_split
from rlinf_like.runners.common import connect_weight_sync, write_worker_pids
from rlinf_like.runners.reasoning.config import COMPONENTS, ReasoningConfig
from rlinf_like.runners.reasoning.schedules import SCHEDULES, STATIC
from rlinf_like.runners.reasoning.worker_configs import loop_terms, reward_config
from rlinf_like.runners.reasoning.worker_set import Workers
from rlinf_like.runtime import Cluster, Device, Placement, PlacementMode, devices_of, plan_placement
from rlinf_like.training.loop import AUTO_ROWS_CAP
from rlinf_like.utils import hardware
from rlinf_like.workers.actor.backends import backend_class
from rlinf_like.workers.actor.worker import ActorWorker
from rlinf_like.workers.critic import CriticConfig, CriticWorker
from rlinf_like.workers.inference.worker import InferenceWorker
from rlinf_like.workers.reward.fn import needs_judge
from rlinf_like.workers.reward.judge_worker import JudgeWorker
from rlinf_like.workers.reward.worker import RewardWorker
from rlinf_like.workers.rollout.agentic.agent_rollout import AgentSetup
from rlinf_like.workers.rollout.base import rollout_dtype
from rlinf_like.workers.rollout.worker import RolloutWorker

log = logging.getLogger(__name__)
# per component, the keys that reduce its memory: named by the WorkerDiedError of a rank killed for memory
MEMORY_ADVICE = {
    "actor": "actor.loop.max_tokens_per_micro_batch (or actor.loop.micro_batch_size), actor.memory_gb, actor.lora.rank",
    "critic": "actor.loop.max_tokens_per_micro_batch (or actor.loop.micro_batch_size)",
    "rollout": "rollout.kv_cache_memory_gb (or rollout.kv_cache_memory_fraction), rollout.max_batch_size, "
               "rollout.max_context",
    "reference": "actor.loop.micro_batch_size",
}


def plan(cfg: ReasoningConfig, devices: dict[str, list[Device]], estimator: AdvantageEstimator,
         check_placement: Callable[[Placement], None] | None = None) -> tuple[Placement, list[str]]:
    """The placement on `devices` and the components the run launches, checked before any worker starts: every
    needed component placed, the batch split evenly over every trained component's data-parallel ranks."""
    a = cfg.algorithm
    placement = plan_placement(cfg.cluster.component_placement, devices, COMPONENTS)
    optional = {"reference": ("algorithm.kl_beta > 0", a.kl_beta > 0 and not reference_in_actor(cfg)),
                "critic": (f"algorithm.advantage={a.advantage}", estimator.needs_critic),
                "teacher": (f"algorithm.advantage={a.advantage}", estimator.needs_teacher),
                "judge": ("reward.fn=judge", needs_judge(reward_config(cfg).fn))}
    needed = ["actor", "rollout", "reward"] + [c for c, (_, used) in optional.items() if used]
    missing = [c for c in needed if c not in placement.components]
    if missing:
        why = "".join(f" ({c}: with {optional[c][0]})" for c in missing if c in optional)
        raise ValueError(f"cluster.component_placement places no {missing}{why}; "
                         f"it places {sorted(placement.components)}")
    # the actor's rows split over its data-parallel replicas (TP x PP ranks of one replica share them)
    split = "actor" if cfg.actor.tp_size * cfg.actor.pp_size == 1 else "actor data-parallel"
    replicas = {split: actor_replicas(cfg, placement["actor"].world_size)}
    if a.kl_beta > 0 and backend_class(cfg.actor.backend).reference_parallel and "reference" in placement.components:
        actor_replicas(cfg, placement["reference"].world_size, "reference")  # the reference is split like the actor
    if estimator.needs_critic:
        replicas["critic"] = placement["critic"].world_size
    check_batch_split(cfg, replicas)
    if check_placement is not None:
        check_placement(placement)
    if placement["actor"].device_kind == "cpu":
        memory.check_actor_memory(memory.actor_memory(cfg, placement["actor"].world_size),
                                  cfg.runner.max_new_tokens + 1, cfg.actor.loop.micro_batch_size)
    return placement, needed


def precision_choice(cfg: ReasoningConfig, kind: str) -> tuple[str, str]:
    """(precision, why) of the actor on devices of `kind`, as its workers will resolve it."""
    chosen = actor_precision(cfg)
    if chosen != "auto":
        return chosen, "set in the config" if cfg.actor.precision != "auto" else "algorithm.recompute_by_length"
    backend = backend_class(cfg.actor.backend)
    if backend.cpu_precision is not None and kind != "gpu":
        return backend.cpu_precision, f"actor.backend={cfg.actor.backend} off a GPU"
    return hardware.auto_precision(torch.device("cuda" if kind == "gpu" else "cpu"))


def actor_tokens(cfg: ReasoningConfig, placement: Placement) -> tuple[int, bool]:
    """The token budget that sizes the actor's micro-batches when actor.loop.micro_batch_size is null, and whether its
    ranks must trade speed for memory (`FSDPConfig.lean`), logged with the precision `auto` chose. Host memory
    bounds a CPU actor; a GPU actor keeps 64-row micro-batches."""
    kind = placement["actor"].device_kind
    log.info("actor precision: %s (%s)" % precision_choice(cfg, kind))
    if kind == "gpu":  # no host-memory bound: micro-batches of AUTO_ROWS_CAP rows
        return 1 << 62, False
    budget = memory.actor_memory(cfg, placement["actor"].world_size)
    log.info(f"actor memory: {budget.describe()}")
    return budget.tokens, budget.raised


def rollout_dtype_choice(cfg: ReasoningConfig, placement: Placement) -> tuple[str, str]:
    """(rollout dtype, why): rollout.dtype as set, else float32 while the actor trains in fp32 (rollout logprobs
    then match the trainer's to the last bits, the on-policy check), else what the rollout's devices support."""
    if cfg.rollout.dtype != "auto":
        return cfg.rollout.dtype, "set in the config"
    actor, why = precision_choice(cfg, placement["actor"].device_kind)
    if actor == "fp32":
        return "float32", f"the actor trains in fp32 ({why})"
    return rollout_dtype("auto", "cuda" if placement["rollout"].device_kind == "gpu" else "cpu")


def rollout_kv_budget(cfg: ReasoningConfig, placement: Placement, prompt_tokens: int | None, dtype: str) -> float:
    """rollout.kv_cache_memory_gb, or for the native engine on CPU with it unset, what this run's samples need
    (`memory.rollout_kv_gb`, in the resolved rollout `dtype`): a share of free memory sized for the model's whole
    context took 1.9 GiB per SmolLM2 replica where the default preset needs 0.5. The ceiling: the engine's fraction of free memory, and
    `memory.ROLLOUT_KV_SHARE` of the machine over the replicas (longer answers then decode fewer at a time)."""
    r = cfg.rollout
    if r.kv_cache_memory_gb > 0 or r.engine != "native" or prompt_tokens is None \
            or placement["rollout"].device_kind != "cpu":
        return r.kv_cache_memory_gb
    tp = r.tp_size or placement["rollout"].world_size
    replicas = placement["rollout"].world_size // tp
    need = memory.rollout_kv_gb(cfg, replicas, prompt_tokens, dtype)
    ceiling = min(r.kv_cache_memory_fraction * memory.available_bytes(),
                  memory.ROLLOUT_KV_SHARE * memory.machine_bytes() / replicas) / 2**30
    log.info(f"rollout KV cache: {min(need, ceiling):.2f} GiB per replica (this run's samples need {need:.2f}, "
             f"the ceiling is {ceiling:.2f}; rollout.kv_cache_memory_gb sets it)")
    return math.ceil(min(need, ceiling) * 1e4) / 1e4  # rounded up: never below one sequence of the context


def plan_before_start(cfg: ReasoningConfig, estimator: AdvantageEstimator,
                      check_placement: Callable[[Placement], None] | None = None) -> None:
    """On a cluster this process starts itself (none to join), `plan` on the devices it will have: a placement or a
    batch split that cannot work fails before Ray's ~10 s start-up, naming its key. A joined cluster's devices are
    known only once joined (`place`)."""
    if cfg.cluster.backend == "ray" and (cfg.cluster.address or os.environ.get("RAY_ADDRESS")):
        return
    plan(cfg, devices_of(cfg.cluster), estimator, check_placement)


def place(cfg: ReasoningConfig, cluster: Cluster, estimator: AdvantageEstimator,
          check_placement: Callable[[Placement], None] | None = None) -> Placement:
    """`plan` on the cluster's devices; in process (cluster.backend=local) each launched component has one rank."""
    placement, needed = plan(cfg, cluster.devices, estimator, check_placement)
    cluster.check_in_process(placement, needed)
    return placement


def launch_workers(cfg: ReasoningConfig, cluster: Cluster, model_path: str, estimator: AdvantageEstimator,
                   out: Path, actor_worker: type[ActorWorker] = ActorWorker,
                   check_placement: Callable[[Placement], None] | None = None,
                   prompt_tokens: int | None = None) -> Workers:
    """Actor (and critic), rollout and reward, with the actor -> rollout weight sync connected. `prompt_tokens`:
    the longest prompt the run has seen, which sizes the native engine's KV cache on CPU."""
    placement = place(cfg, cluster, estimator, check_placement)
    check_targets_of(cfg.actor.lora, model_path)  # names in actor.lora.target_modules, before any worker starts
    log.info(placement.describe())
    tokens, lean = actor_tokens(cfg, placement)
    actor = actor_worker.create_group(actor_config(cfg, model_path, tokens, lean)).launch(
        cluster, placement, "actor", memory_advice=MEMORY_ADVICE["actor"])
    critic = None
    if estimator.needs_critic:
        fsdp = FSDPConfig(optim=OptimConfig(lr=cfg.critic.lr), precision=actor_precision(cfg))
        critic_cfg = CriticConfig(model_path=model_path, fsdp=fsdp, loop=cfg.actor.loop,
                                 loop_terms=loop_terms(cfg, tokens), value_clip=cfg.critic.value_clip)
        critic = CriticWorker.create_group(critic_cfg).launch(cluster, placement, "critic",
                                                              memory_advice=MEMORY_ADVICE["critic"])
    teacher = None
    if estimator.needs_teacher:  # frozen: the actor's numerics, its rows per forward
        teacher = frozen_model(cfg, cfg.teacher.model_path).launch(cluster, placement, "teacher",
                                                                    memory_advice=MEMORY_ADVICE["reference"])
    serving = cfg.runner.schedule != STATIC and SCHEDULES.get(cfg.runner.schedule).serves_continuously \
        or cfg.agent.multi_turn
    dtype, why = rollout_dtype_choice(cfg, placement)
    log.info(f"rollout dtype: {dtype} ({why})")
    rollout_cfg = replace(cfg.rollout, model_path=cfg.rollout.model_path or model_path, dtype=dtype,
                          # serving continuously: every rank on its own (tp 0 would make the group one engine)
                          tp_size=cfg.rollout.tp_size or (1 if serving else 0),
                          return_routes=cfg.rollout.return_routes or cfg.actor.routing_replay == "R3",
                          kv_cache_memory_gb=rollout_kv_budget(cfg, placement, prompt_tokens, dtype))
    rollout = RolloutWorker.create_group(rollout_cfg, agent_setup(cfg)).launch(
        cluster, placement, "rollout", memory_advice=MEMORY_ADVICE["rollout"])
    reward = RewardWorker.create_group(model_path, reward_config(cfg), cfg.judge).launch(
        cluster, placement, "reward", init_process_group=False)
    judge = None
    if needs_judge(reward_config(cfg).fn):  # the judge decodes with the policy's tokenizer, scores with its own
        judge = JudgeWorker.create_group(model_path, cfg.judge).launch(cluster, placement, "judge",
                                                                       init_process_group=False)
    connect_weight_sync(actor, rollout, "weights", *placement.weight_link("actor", "rollout"))
    workers = Workers(placement=placement, actor=actor, actor_dp=actor.data_parallel().wait(), rollout=rollout,
                      reward=reward, critic=critic, teacher=teacher, judge=judge, reference_in_actor=reference_in_actor(cfg),
                      collocated=placement.relation("actor", "rollout") is not PlacementMode.DISAGGREGATED)
    write_worker_pids(out, workers.all_groups())
    return workers


def frozen_model(cfg: ReasoningConfig, model_path: str, megatron=None):
    """A frozen model that scores the actor's batches (the KL reference, the distillation teacher) with the
    actor's numerics: its rows per forward, packing, precision and the sampling temperature."""
    loop = actor_loop(cfg)
    return InferenceWorker.create_group(model_path, loop.micro_batch_size or AUTO_ROWS_CAP, cfg.runner.temperature,
                                        loop.pack_sequences, loop.max_batch_seqlen, megatron, actor_precision(cfg),
                                        loop.share_prompt)


def agent_setup(cfg: ReasoningConfig) -> AgentSetup | None:
    """Multi-turn mode's settings for the rollout (None: single turn)."""
    if not cfg.agent.multi_turn:
        return None
    return AgentSetup(agent=cfg.agent, chat_template=chat_template_text(cfg.data), system_prompt=cfg.data.system_prompt)


def launch_reference(cfg: ReasoningConfig, cluster: Cluster, w: Workers, start: Path, out: Path) -> None:
    """The KL reference (`algorithm.kl_beta > 0`): the policy RL starts from (`start`), frozen, on the actor's
    backend so its logprobs are the actor's own numerics: the first step's KL is 0. Under LoRA none: the actor
    computes the reference with its adapters disabled."""
    if cfg.algorithm.kl_beta <= 0:
        return
    if w.reference_in_actor:
        if "reference" in w.placement.components:
            log.info("actor.lora: the KL reference is the actor's base model; cluster.component_placement.reference "
                     "is not used")
        return
    if not (start / "config.json").exists():
        raise FileNotFoundError(f"the KL reference model {start} is missing: it is exported after the SFT "
                                f"warm-start (this run directory predates that, or was cut short before it)")
    megatron = actor_config(cfg, str(start)).megatron if backend_class(cfg.actor.backend).reference_parallel else None
    w.reference = frozen_model(cfg, str(start), megatron).launch(cluster, w.placement, "reference",
                                                                 memory_advice=MEMORY_ADVICE["reference"])
    write_worker_pids(out, w.all_groups())
