"""The reasoning runner's config schema: dataclasses are the source of truth, YAML presets are
small, and `structure(ReasoningConfig, cfg)` rejects an unknown key by name before any worker starts."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_like.scheduler import ClusterConfig
from rlinf_like.workers.reward.rules import RewardConfig

COMPONENTS = ("actor", "rollout", "reward", "reference", "critic")


@dataclass
class TaskConfig:
    kind: str = "arithmetic"  # "arithmetic" (generated) or "jsonl" (train_path / test_path)
    terms: int = 3  # with worked left-to-right steps in the SFT solutions
    max_operand: int = 9
    operators: str = "+-"
    sft_problems: int = 600  # warm-start set; RL draws fresh problems outside the held-out set
    test_problems: int = 200
    seed: int = 0
    train_path: str = ""
    test_path: str = ""


@dataclass
class ModelConfig:
    path: str = ""  # an HF checkpoint directory; empty: build the tiny model below
    arch: str = "qwen2"
    hidden_size: int = 128
    intermediate_size: int = 352
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    init_std: float = 0.02
    seed: int = 0


@dataclass
class AlgorithmConfig:
    advantage: str = "grpo"  # grpo | rloo (per response) | reinforce_pp (per token, batch-whitened) | gae (PPO, critic)
    scale_by_std: bool = True  # grpo only; false = Dr. GRPO
    samples_per_prompt: int = 8
    lr: float = 5e-4
    epochs: int = 1
    mini_batches: int = 1
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    aggregation: str = "token-mean"
    kl_beta: float = 0.0  # > 0 launches the reference model
    kl_estimator: str = "k3"
    kl_in_reward: bool = False  # KL as a per-token reward penalty (REINFORCE++ / PPO style), not a loss term
    entropy_coef: float = 0.0
    recompute_logprobs: bool = False  # old logprobs from the trainer, not the rollout engine
    is_correction_cap: float | None = None  # with recompute: truncated pi_trainer / pi_rollout weights
    gamma: float = 1.0  # gae: discount over response tokens
    lam: float = 1.0  # gae: 1 = Monte-Carlo return minus V (robust with a young critic), lower trusts V more
    critic_lr: float = 1.0e-3  # gae: the value model's learning rate
    value_clip: float | None = 0.2  # gae: PPO value clipping; null = off
    critic_warmup_steps: int = 0  # gae: the first k steps train the value model only (actor unchanged)


@dataclass
class ActorSection:
    backend: str = "fsdp"  # fsdp | megatron (the [megatron] extra; not with runner.schedule=dynamic)
    tp_size: int = 1  # megatron: tensor-parallel ranks per replica; tp_size x pp_size must divide the actor's ranks
    pp_size: int = 1  # megatron: pipeline stages per replica (not with runner.pack_sequences)


@dataclass
class RolloutSection:
    engine: str = "native"  # native | hf | sglang
    tp_size: int = 1  # ranks per engine; the rollout group holds world / tp_size data-parallel replicas
    max_batch_size: int = 128  # continuous-batching slots per engine
    dtype: str = "float32"  # the rollout's weights; a weight sync converts to it once, at the sender
    logprobs: str = "sampled"  # "rescored": one extra pass per sample, same floats whatever the batch (native)


@dataclass
class RunnerConfig:
    max_steps: int = 60
    prompts_per_step: int = 16
    max_new_tokens: int = 28  # "3+5=8, 8-2=6. Answer: 6" and EOS
    temperature: float = 1.0
    max_staleness: int = 0  # 0: on-policy; k > 0 lets rollout run k steps ahead (pipelined)
    sft_steps: int = 300
    sft_batch_size: int = 64
    sft_lr: float = 2e-3
    eval_every: int = 10
    save_every: int = 20
    resume: bool = False
    output_dir: str = "runs/reasoning"
    micro_batch_size: int | None = 64  # rows per forward (per rank); null: a whole mini-batch / shard in one pass
    schedule: str = "static"  # collocated: "dynamic" hands finished rollout replicas' devices to the actor early
    migrate_at: float = 0.0  # dynamic: once this share of a step's groups is done, unfinished ones move to fewer
    # replicas (ceil(replicas * share left)) and the freed devices go to the actor; 0 = never migrate
    pack_sequences: bool = False  # actor/critic micro-batches run packed (no compute on padding)
    max_batch_seqlen: int | None = None  # packed row length; null: each micro-batch's longest sequence
    max_tokens_per_micro_batch: int | None = None  # token-budget micro-batches (per rank) instead of micro_batch_size
    nonfinite: str = "skip"  # a NaN/inf loss or grad norm: "skip" that optimizer step (weights unchanged) or "stop"
    seed: int = 0


@dataclass
class ReasoningConfig:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    runner: RunnerConfig = field(default_factory=RunnerConfig)
    actor: ActorSection = field(default_factory=ActorSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    reward: RewardConfig = field(default_factory=RewardConfig)
