"""The embodied runner's config schema (hydra presets build on it; `structure` rejects unknown keys)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rlinf_like.envs import EnvConfig
from rlinf_like.models.policies import PolicyConfig
from rlinf_like.scheduler import ClusterConfig
from rlinf_like.workers.actor.ppo import PPOConfig

COMPONENTS = ("actor", "rollout", "env")


@dataclass
class EmbodiedAlgorithm(PPOConfig):
    lr: float = 3e-4
    adam_eps: float = 1e-5
    max_grad_norm: float = 0.5


@dataclass
class EmbodiedRunnerConfig:
    total_env_steps: int = 100_000
    steps_per_rollout: int = 128  # T: steps per env per PPO update
    pipeline: bool = False  # each env worker splits its envs into 2 stages that overlap with inference
    env_in_rollout: bool = False  # no env workers: each rollout rank steps env.num_envs envs in its own process
    # each rollout rank puts every `stream_chunk_steps` steps on the trajectory channel as soon as they are
    # whole; the actor computes their finished episodes' GAE while collection goes on (same batch, bit for bit)
    stream_trajectories: bool = False
    stream_chunk_steps: int = 32
    save_every: int = 10  # PPO updates between checkpoints
    resume: bool = False
    output_dir: str = "runs/embodied"
    gif: bool = False  # a short GIF of the final policy
    seed: int = 0


@dataclass
class EmbodiedConfig:
    cluster: ClusterConfig = field(default_factory=lambda: ClusterConfig(
        num_cpus=2, component_placement={"actor": "0", "rollout": "0", "env": "1"}))
    env: EnvConfig = field(default_factory=EnvConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    algorithm: EmbodiedAlgorithm = field(default_factory=EmbodiedAlgorithm)
    runner: EmbodiedRunnerConfig = field(default_factory=EmbodiedRunnerConfig)
