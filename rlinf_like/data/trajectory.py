"""What the rollout sends the actor in embodied RL, and how it becomes a PPO batch.

A `Trajectory` is T steps of one rollout rank's envs, time-major ([T, n, ...]). `bootstrap[t, i]`
is the value to continue from when env i's episode segment ends after step t: 0 after a terminal
state, V(final obs) after a time-limit truncation, V(next obs) at the last collected step.

`episode_gae` cuts each env's row at episode ends into segments, pads them into [segments, L]
and runs the shared `algorithms.gae` (mask = valid steps, `last_values` = the bootstrap), so the
same GAE serves text (one segment per response) and envs (many episodes per row).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from rlinf_like.algorithms import gae


@dataclass
class Trajectory:
    obs: dict[str, torch.Tensor]  # [T, n, ...] per field
    actions: torch.Tensor  # [T, n, ...] the policy's actions (e.g. token ids for a VLA)
    logprobs: torch.Tensor  # [T, n]
    values: torch.Tensor  # [T, n]
    rewards: torch.Tensor  # [T, n]
    dones: torch.Tensor  # [T, n] bool: the episode ended at this step (terminated or truncated)
    bootstrap: torch.Tensor  # [T, n]
    version: int  # policy weights that produced it


def episode_gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, bootstrap: torch.Tensor,
                gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over [T, n] with episode boundaries; returns (advantages, returns), both [T, n]."""
    steps, n = rewards.shape
    segments: list[tuple[int, int, int]] = []  # (env, start, stop)
    for i in range(n):
        ends = torch.nonzero(dones[:, i]).flatten().tolist()
        start = 0
        for end in ends + ([steps - 1] if not ends or ends[-1] != steps - 1 else []):
            segments.append((i, start, end + 1))
            start = end + 1
    length = max(stop - start for _, start, stop in segments)
    shape = (len(segments), length)
    r, v, mask = torch.zeros(shape), torch.zeros(shape), torch.zeros(shape)
    last = torch.zeros(len(segments))
    for s, (i, start, stop) in enumerate(segments):
        k = stop - start
        r[s, :k], v[s, :k], mask[s, :k] = rewards[start:stop, i], values[start:stop, i], 1.0
        last[s] = bootstrap[stop - 1, i]
    adv, ret = gae(r, v, mask, gamma, lam, last_values=last)
    advantages, returns = torch.zeros(steps, n), torch.zeros(steps, n)
    for s, (i, start, stop) in enumerate(segments):
        k = stop - start
        advantages[start:stop, i], returns[start:stop, i] = adv[s, :k], ret[s, :k]
    return advantages, returns


def ppo_batch(trajectories: list[Trajectory], gamma: float, lam: float) -> dict[str, torch.Tensor]:
    """Flat rows for the actor: obs fields, actions, old logprobs / values, advantages, returns."""
    rows: dict[str, list[torch.Tensor]] = {}
    for traj in trajectories:
        adv, ret = episode_gae(traj.rewards.float(), traj.values.float(), traj.dones.bool(),
                               traj.bootstrap.float(), gamma, lam)
        fields = {**traj.obs, "actions": traj.actions, "old_logprobs": traj.logprobs, "old_values": traj.values,
                  "advantages": adv, "returns": ret}
        for k, v in fields.items():
            rows.setdefault(k, []).append(v.reshape(-1, *v.shape[2:]))
    return {k: torch.cat(v) for k, v in rows.items()}
