"""The small reasoning run the end-to-end tests start from: collocated on the 2 CPU slots, 32 SFT / 4 held-out
arithmetic problems, no SFT warm start, 4 prompts of up to 8 new tokens per step, no evaluation between steps.
Each test sets what it is about on top."""

from pathlib import Path

from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runtime import ClusterConfig


def small_reasoning_config(out: Path, *, max_steps: int = 2, save_every: int = 100,
                           samples_per_prompt: int = 4) -> ReasoningConfig:
    cfg = ReasoningConfig()
    cfg.cluster = ClusterConfig(num_cpus=2, collective_timeout_s=120,
                                component_placement={"actor,rollout": "0-1", "reward": "0"})
    cfg.data.sft_problems, cfg.data.test_problems = 32, 4
    r = cfg.runner
    r.max_steps, r.prompts_per_step, r.max_new_tokens, r.sft_steps = max_steps, 4, 8, 0
    cfg.actor.loop.micro_batch_size = 8
    r.eval_every, r.save_every, r.output_dir = 100, save_every, str(out)
    cfg.algorithm.samples_per_prompt = samples_per_prompt
    return cfg


ONE_SLOT = {"actor,rollout": "0", "reward": "1"}  # collocated, one rank each: what runs in process


def in_process(cfg: ReasoningConfig, placement: dict[str, str] | None = None) -> ReasoningConfig:
    """`cfg` on the in-process backend (cluster.backend=local): no Ray and no worker processes to start, one rank
    per group (`placement`, by default actor and rollout collocated on slot 0, the reward on slot 1). For the runs
    whose subject is not the process boundary."""
    cfg.cluster.backend = "local"
    several = any(mark in devices for devices in cfg.cluster.component_placement.values() for mark in "-,*a")
    if placement is not None or several:  # a range, a list, "0*2" or "all": more than one rank
        cfg.cluster.component_placement = dict(placement or ONE_SLOT)
    return cfg
