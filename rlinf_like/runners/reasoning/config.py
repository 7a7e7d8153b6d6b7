"""The reasoning runner's config schema: dataclasses are the source of truth, YAML presets are
small, and `structure(ReasoningConfig, cfg)` rejects an unknown key, a value outside a `Literal`
and a value outside a field's bounds by name before any worker starts. Every key carries a comment:
`python examples/reasoning/main_grpo.py --help` prints them (rlinf_like/config/schema.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from rlinf_like.algorithms.advantage_estimators.gae import GAEOptions
from rlinf_like.algorithms.advantage_estimators.grpo import GRPOOptions
from rlinf_like.algorithms.advantage_estimators.opd import OPDOptions
from rlinf_like.config.validate import bounded
from rlinf_like.data.config import DataConfig
from rlinf_like.envs.text.config import AgentConfig
from rlinf_like.hybrid_engines.fsdp.lora import LoraConfig
from rlinf_like.hybrid_engines.routing_replay import REPLAY_MODES
from rlinf_like.runtime import ClusterConfig
from rlinf_like.training.loop import LoopConfig, LoopTerms
from rlinf_like.utils.tracking import LoggerConfig
from rlinf_like.workers.actor.config import ActorConfig
from rlinf_like.workers.actor.loss import LossConfig, LossTerms
from rlinf_like.workers.critic import CriticConfig
from rlinf_like.workers.reward.judge import JudgeConfig
from rlinf_like.workers.reward.rules import RewardConfig
from rlinf_like.workers.rollout.base import RolloutConfig

COMPONENTS = ("actor", "rollout", "reward", "reference", "critic", "teacher", "judge")


@dataclass(kw_only=True)
class ModelSection:
    path: str = ""  # an HF checkpoint directory; empty: build the tiny model below
    arch: str = "qwen2"  # the tiny model's HF architecture
    hidden_size: int = bounded(128, ge=1)  # tiny model: width
    intermediate_size: int = bounded(352, ge=1)  # tiny model: MLP width
    num_layers: int = bounded(2, ge=1)  # tiny model: decoder layers
    num_heads: int = bounded(4, ge=1)  # tiny model: attention heads
    num_kv_heads: int = bounded(2, ge=1)  # tiny model: key/value heads (grouped-query attention)
    init_std: float = bounded(0.02, gt=0)  # tiny model: initial weights' standard deviation
    max_positions: int = bounded(256, ge=16)  # tiny model: its context (multi-turn agents need more)
    seed: int = 0  # seeds the tiny model's initial weights


@dataclass(kw_only=True)
class AlgorithmConfig:
    advantage: str = "grpo"  # grpo | rloo (per response) | reinforce_pp (per token, batch-whitened) | gae (PPO, critic)
    grpo: GRPOOptions = field(default_factory=GRPOOptions)  # algorithm.advantage=grpo: its options
    gae: GAEOptions = field(default_factory=GAEOptions)  # algorithm.advantage=gae: its options (the critic: critic.*)
    opd: OPDOptions = field(default_factory=OPDOptions)  # algorithm.advantage=opd: on-policy distillation (teacher.*)
    samples_per_prompt: int = bounded(8, gt=0)  # responses sampled per prompt (a GRPO group)
    lr: float = bounded(5e-4, gt=0)  # the actor's learning rate (AdamW)
    # > 0 launches the reference model; the KL estimator is actor.loss.kl_estimator
    kl_beta: float = bounded(LossTerms.kl_beta, ge=0)
    kl_in_reward: bool = False  # KL as a per-token reward penalty (REINFORCE++ / PPO style), not a loss term
    # the trainer recomputes pi_old. The train/rollout mismatch (mismatch/kl_k3, abs_log_ratio_*) is logged without
    # it when a step makes one update (actor.loop.mini_batches = epochs = 1), and needs it otherwise
    recompute_logprobs: bool = False
    # recompute one unpadded forward per row length (slower): on CPU in fp32 with rollout.logprobs=rescored the
    # proximal logprobs then equal the native engine's bit for bit (a padded batch changes their last bits)
    recompute_by_length: bool = False


@dataclass(kw_only=True)
class CriticSection:
    """The value model, launched when the advantage estimator declares `needs_critic` (gae)."""
    lr: float = bounded(1.0e-3, gt=0)  # the value model's learning rate
    value_clip: float | None = bounded(CriticConfig.value_clip, gt=0)  # PPO value clipping; null = off
    warmup_steps: int = bounded(0, ge=0)  # the first k steps train the value model only (actor unchanged)


@dataclass(kw_only=True)
class TeacherSection:
    """The frozen model that grades every sampled token, launched when the estimator declares `needs_teacher`
    (opd). It must share the student's tokenizer and vocabulary size; placed as `cluster.component_placement.teacher`."""
    model_path: str = ""  # an HF checkpoint directory


@dataclass(kw_only=True)
class ActorSection:
    # a name in BACKEND_REGISTRY (workers/actor/backends.py): fsdp | megatron (the [megatron] extra)
    backend: str = ActorConfig.backend
    # megatron: tensor-parallel ranks per replica; tp_size x pp_size must divide the actor's ranks
    tp_size: int = bounded(1, ge=1)
    pp_size: int = bounded(1, ge=1)  # megatron: pipeline stages per replica (not with actor.loop.pack_sequences)
    # LoRA adapters (peft; fsdp only): rank 0 = off; with algorithm.kl_beta > 0 the reference is the base in the actor
    lora: LoraConfig = field(default_factory=LoraConfig)
    # the RL loss as the actor receives it: PPO clip, aggregation, policy objective, importance correction, KL
    # estimator, entropy bonus (workers/actor/loss.py)
    loss: LossConfig = field(default_factory=LossConfig)
    # the training loop as the actor (and the critic) receive it: epochs, mini-batches, micro-batch rows or token
    # budget, packing (training/loop.py); micro_batch_size null: as many rows as actor.memory_gb holds, at most 64
    loop: LoopConfig = field(default_factory=LoopConfig)
    # fsdp: auto = bf16 on a GPU or a CPU with bf16 units (AVX512_BF16, AMX), else fp32; bf16 keeps fp32 weights and
    # optimizer state. algorithm.recompute_by_length needs fp32 (auto picks it then)
    precision: Literal["auto", "bf16", "fp32"] = "auto"
    # host memory (GB) one actor rank may use; sizes the token-budget micro-batches and the pre-launch estimate.
    # null: a share of this machine's memory (runners/reasoning/memory.py)
    memory_gb: float | None = bounded(None, gt=0)
    # mixture-of-experts models: R3 runs the experts the rollout engine chose for each token in the trainer's forward
    # (rollout routing replay, hybrid_engines/routing_replay.py; the native engine returns them); R2 the experts the
    # trainer chose when it recomputed pi_old (needs algorithm.recompute_logprobs; any engine); disabled: the
    # trainer's routers choose (with rollout.return_routes the moe/ agreement metrics are still logged)
    routing_replay: Literal[REPLAY_MODES] = "disabled"


@dataclass(kw_only=True)
class RunnerConfig:
    max_steps: int = bounded(60, gt=0)  # GRPO steps after the SFT warm start
    prompts_per_step: int = bounded(16, gt=0)  # prompts per step; each gets algorithm.samples_per_prompt responses
    max_new_tokens: int = bounded(28, gt=0)  # "3+5=8, 8-2=6. Answer: 6" and EOS
    temperature: float = bounded(LossTerms.temperature, gt=0)  # sampling temperature (the trainer's logprobs too)
    max_staleness: int = bounded(0, ge=0)  # 0: on-policy; k > 0 lets rollout run k steps ahead (pipelined, async)
    # async: a group more than max_staleness versions behind is dropped (counted) | never produced (wait: the
    # rollout pauses admission while it is max_staleness steps ahead; see runners/reasoning/async_stream.py)
    stale_policy: str = "wait"
    sft_steps: int = bounded(300, ge=0)  # SFT warm-start steps before RL; 0: none
    sft_batch_size: int = bounded(64, gt=0)  # SFT rows per step
    sft_lr: float = bounded(2e-3, gt=0)  # SFT learning rate
    eval_every: int = bounded(10, gt=0)  # steps between held-out evaluations
    save_every: int = bounded(20, gt=0)  # steps between checkpoints
    resume: bool = False  # continue from the checkpoint in output_dir
    # a dead worker process: relaunch every group and resume from the last checkpoint in this driver, replaying the
    # steps since (bit-exact), at most this many times a run (runtime/recovery.py); 0: the run stops, naming it
    max_restarts: int = bounded(0, ge=0)
    output_dir: str = "runs/reasoning"  # checkpoints, TensorBoard scalars, curves.png, the final model
    # a loop in runners/reasoning/schedules/: static (collocated or pipelined, by the placement) | collocated | pipelined |
    # dynamic (collocated; hands finished rollout replicas' devices to the actor mid-step) | async (own devices;
    # the rollout serves without a step boundary and takes new weights between decode steps)
    schedule: str = "static"
    # dynamic: once this share of a step's groups is done, unfinished ones move to fewer
    # replicas (ceil(replicas * share left)) and the freed devices go to the actor; 0 = never migrate
    migrate_at: float = bounded(0.0, ge=0, lt=1)
    # a NaN/inf loss or grad norm: "skip" that optimizer step (weights unchanged) or "stop"
    nonfinite: Literal["skip", "stop"] = "skip"
    seed: int = LoopTerms.seed  # seeds sampling, data order and the trainers' shuffles


@dataclass(kw_only=True)
class ReasoningConfig:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # where Ray runs and where each component's ranks go
    data: DataConfig = field(default_factory=DataConfig)  # the problems (generated, files, reasoning_gym) and prompt format
    model: ModelSection = field(default_factory=ModelSection)  # the policy model (and the reference / critic's start)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)  # advantages, loss, KL, optimizer
    runner: RunnerConfig = field(default_factory=RunnerConfig)  # the training loop: steps, batch sizes, checkpoints
    actor: ActorSection = field(default_factory=ActorSection)  # the trainer's backend and parallelism
    critic: CriticSection = field(default_factory=CriticSection)  # the value model (algorithm.advantage=gae)
    teacher: TeacherSection = field(default_factory=TeacherSection)  # the distillation teacher (algorithm.advantage=opd)
    # the generation engine (the engine's own config; model_path empty: the run's model)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)  # rule and/or learned-model rewards
    judge: JudgeConfig = field(default_factory=JudgeConfig)  # reward.fn=judge: the LLM judge, its prompt and parser
    agent: AgentConfig = field(default_factory=AgentConfig)  # multi-turn rollouts: a text environment or agent program
    logger: LoggerConfig = field(default_factory=LoggerConfig)  # where metrics go: TensorBoard, W&B, console

    # keys that moved: an old name is refused with its new one (config/validate.py)
    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "task.kind": "data.source (arithmetic | files | reasoning_gym)",
        "task.train_path": "data.train_files (a list)", "task.test_path": "data.test_files (a list)",
        **{f"task.{k}": f"data.{k}" for k in ("terms", "max_operand", "operators", "sft_problems", "test_problems",
                                               "seed")},
        "task": "data",
        "algorithm.is_correction_cap": "actor.loss.is_correction=tis with actor.loss.is_cap=<cap>",
        "algorithm.scale_by_std": "algorithm.grpo.scale_by_std",
        "algorithm.gamma": "algorithm.gae.gamma", "algorithm.lam": "algorithm.gae.lam",
        "algorithm.critic_lr": "critic.lr", "algorithm.value_clip": "critic.value_clip",
        "algorithm.critic_warmup_steps": "critic.warmup_steps",
        "algorithm.loss": "actor.loss.objective",
        **{f"algorithm.{k}": f"actor.loop.{k}" for k in ("epochs", "mini_batches")},
        **{f"runner.{k}": f"actor.loop.{k}" for k in ("micro_batch_size", "pack_sequences", "max_batch_seqlen",
                                                      "max_tokens_per_micro_batch")},
        **{f"algorithm.{k}": f"actor.loss.{k}" for k in ("clip_low", "clip_high", "dual_clip", "aggregation",
                                                         "kl_estimator", "entropy_coef", "is_correction", "is_cap",
                                                         "is_low", "is_high")},
    }
