"""GRPO (and RLOO) for embodied policies: groups of episodes started from the same initial state.

Before each PPO update the envs are reset with group seeds (`group_seeds`): `algorithm.ppo.group_size`
consecutive envs of a pipeline stage share one seed, so they start from the same state and differ only by the
policy's sampling. The collect must hold each env's whole first episode (`runner.steps_per_rollout` >= the
episode length); what follows it in the collect is masked out. Each episode's undiscounted return is its
outcome; the registered advantage estimator (`algorithm.ppo.advantage`, one that declares `embodied`) turns the
[groups, group_size] outcomes into group-relative advantages, given to every step of the episode.
"""

from __future__ import annotations

import torch

from rlinf_like.algorithms.advantage_estimators import AdvantageEstimator, AdvantageInputs


def check_groups(cfg) -> None:
    """What grouped episodes need of an embodied config, refused by key before any worker starts."""
    r, ppo = cfg.runner, cfg.algorithm.ppo
    g = ppo.group_size
    per_stage = cfg.env.num_envs // (2 if r.pipeline else 1)
    if per_stage % g:
        raise ValueError(f"algorithm.ppo.advantage={ppo.advantage} groups algorithm.ppo.group_size={g} consecutive "
                         f"envs of a stage: env.num_envs per stage ({per_stage}) must be a multiple of it")
    if r.stream_trajectories:
        raise ValueError(f"algorithm.ppo.advantage={ppo.advantage} needs whole episodes before any advantage: "
                         "set runner.stream_trajectories=false")


def group_seeds(seed: int, first_env: int, count: int, group_size: int) -> list[int]:
    """Reset seeds of envs first_env .. first_env + count - 1 (global indices): one per group."""
    return [seed + (first_env + i) // group_size for i in range(count)]


def episode_group_advantages(rewards: torch.Tensor, dones: torch.Tensor, group_size: int,
                             estimator: AdvantageEstimator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[T, n] rewards and dones, columns in groups of `group_size` -> (advantages [T, n], episode returns [n],
    mask [T, n]: 1 on each env's first episode)."""
    steps, n = rewards.shape
    ended = dones.bool()
    if not bool(ended.any(0).all()):
        cols = torch.nonzero(~ended.any(0)).flatten().tolist()
        raise ValueError(f"envs {cols[:8]} did not finish an episode in runner.steps_per_rollout={steps} steps: grouped "
                         "advantages compare whole episodes, raise it to the env's episode length")
    first_end = ended.float().argmax(0)  # [n]: the step each env's first episode ends
    mask = (torch.arange(steps)[:, None] <= first_end[None]).float()
    returns = (rewards.float() * mask).sum(0)
    out = estimator.estimate(AdvantageInputs(rewards=returns.reshape(n // group_size, group_size),
                                             response_mask=torch.ones(n, 1)))
    return out.advantages.reshape(1, n) * mask, returns, mask
