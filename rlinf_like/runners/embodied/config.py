"""The embodied runner's config schema (hydra presets build on it; `structure` rejects unknown keys,
values outside a `Literal` and values outside a field's bounds). Every key carries a comment:
`python examples/embodied/main_embodied.py --help` prints them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from rlinf_like.config.validate import bounded
from rlinf_like.envs import EnvConfig
from rlinf_like.models.policies import PolicyConfig
from rlinf_like.runtime import ClusterConfig
from rlinf_like.utils.tracking import LoggerConfig
from rlinf_like.workers.actor.ppo import PPOConfig
from rlinf_like.workers.actor.sac_learner import SACConfig

COMPONENTS = ("actor", "rollout", "env")


@dataclass(kw_only=True)
class EmbodiedAlgorithm:
    name: str = "ppo"  # a name in EMBODIED_ALGORITHMS (algorithms/embodied.py): ppo | sac | discrete_sac
    lr: float = bounded(3e-4, gt=0)  # Adam learning rate
    adam_eps: float = bounded(1e-5, gt=0)  # Adam epsilon
    gamma: float = bounded(0.99, ge=0, le=1)  # discount per env step (PPO's GAE, SAC's targets)
    # the keys only PPO reads (algorithm.name=ppo); another algorithm refuses them set away from their defaults
    # (a preset's are dropped, logged)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    # the keys only SAC reads (algorithm.name=sac | discrete_sac); PPO refuses them set away from their defaults
    # (a preset's are dropped, logged)
    sac: SACConfig = field(default_factory=SACConfig)


_PPO_KEYS = ("lam", "clip", "value_clip", "vf_coef", "ent_coef", "normalize_advantages", "epochs", "mini_batches",
             "max_grad_norm", "advantage", "group_size", "grpo")
_SAC_KEYS = ("tau", "batch_size", "buffer_size", "learning_starts", "utd", "n_step", "init_alpha", "target_entropy",
             "target_entropy_ratio")


@dataclass(kw_only=True)
class EmbodiedRunnerConfig:
    total_env_steps: int = bounded(100_000, gt=0)  # the run stops after this many env steps (all envs)
    steps_per_rollout: int = bounded(128, gt=0)  # T: steps per env per PPO update
    pipeline: bool = False  # each env worker splits its envs into 2 stages that overlap with inference
    env_in_rollout: bool = False  # no env workers: each rollout rank steps env.num_envs envs in its own process
    # each rollout rank puts every `stream_chunk_steps` steps on the trajectory channel as soon as they are
    # whole; the actor computes their finished episodes' GAE while collection goes on (same batch, bit for bit)
    stream_trajectories: bool = False
    stream_chunk_steps: int = bounded(32, gt=0)  # stream_trajectories: steps per chunk
    save_every: int = bounded(10, gt=0)  # PPO updates (SAC: rounds) between checkpoints
    # sac: gradient updates between weight syncs to the rollout; a sync happens at the end of a round (a round:
    # steps_per_rollout steps per env, utd x those env steps of updates), so syncs are at least a round apart
    sync_every: int = bounded(1, gt=0)
    save_replay: bool = True  # sac: checkpoint the replay buffer (else a resumed run refills it, logged)
    resume: bool = False  # continue from the checkpoint in output_dir
    # a dead worker process: relaunch every group and resume from the last checkpoint in this driver, replaying the
    # updates since (exact where resume is exact: with env state), at most this many times (runtime/recovery.py)
    max_restarts: int = bounded(0, ge=0)
    output_dir: str = "runs/embodied"  # checkpoints, TensorBoard scalars, the return plot
    gif: bool = False  # a short GIF of the final policy
    seed: int = 0  # seeds envs, sampling and initial weights


@dataclass(kw_only=True)
class EmbodiedConfig:
    # where Ray runs and where each component's ranks go
    cluster: ClusterConfig = field(default_factory=lambda: ClusterConfig(
        num_cpus=2, component_placement={"actor": "0", "rollout": "0", "env": "1"}))
    env: EnvConfig = field(default_factory=EnvConfig)  # the simulator and its vectorisation
    policy: PolicyConfig = field(default_factory=PolicyConfig)  # the actor-critic network
    # the algorithm (its optimizer, discount, and a section of keys per algorithm)
    algorithm: EmbodiedAlgorithm = field(default_factory=EmbodiedAlgorithm)
    runner: EmbodiedRunnerConfig = field(default_factory=EmbodiedRunnerConfig)  # the loop: env steps, checkpoints
    logger: LoggerConfig = field(default_factory=LoggerConfig)  # where metrics go: TensorBoard, W&B, console

    # keys that moved: an old name is refused with its new one (config/validate.py)
    MOVED_KEYS: ClassVar[dict[str, str]] = {
        **{f"algorithm.{k}": f"algorithm.ppo.{k}" for k in _PPO_KEYS},
        **{f"algorithm.{k}": f"algorithm.sac.{k}" for k in _SAC_KEYS},
    }
