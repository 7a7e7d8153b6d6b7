"""What the rollout sends the actor in embodied RL, and how it becomes a PPO batch.

A `Trajectory` is T steps of one rollout rank's envs, time-major ([T, n, ...]). `bootstrap[t, i]`
is the value to continue from when env i's episode segment ends after step t: 0 after a terminal
state, V(final obs) after a time-limit truncation, V(next obs) at the last collected step.

`episode_gae` cuts each env's row at episode ends into segments, pads them into [segments, L]
and runs the shared `algorithms.gae` (mask = valid steps, `last_values` = the bootstrap), so the
same GAE serves text (one segment per response) and envs (many episodes per row).

Streaming (`runner.stream_trajectories`): a rollout rank sends its T steps as time chunks
(`start`, `final`), and `StreamedGAE` computes each episode segment's GAE as soon as the chunks
hold the whole segment (it ended, or the final chunk closes it with its bootstrap). GAE of a
segment only reads that segment's rewards, values and its last step's bootstrap, and `gae` runs
the same per-row float ops whatever a row's padding, so the result equals `episode_gae` over the
whole trajectory bit for bit.
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
    rank: int = 0  # the rollout rank that collected it
    start: int = 0  # its first step within the collect (a streamed chunk starts later than 0)
    final: bool = True  # the collect's last (or only) chunk: `bootstrap` at its last step closes every segment


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


def trajectory_gae(traj: Trajectory, gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    return episode_gae(traj.rewards.float(), traj.values.float(), traj.dones.bool(), traj.bootstrap.float(),
                       gamma, lam)


def join_chunks(chunks: list[Trajectory]) -> Trajectory:
    """One rank's time chunks (in order) as one trajectory."""
    cat = lambda get: torch.cat([get(c) for c in chunks])  # noqa: E731
    last = chunks[-1]
    return Trajectory(obs={k: cat(lambda c, k=k: c.obs[k]) for k in last.obs}, actions=cat(lambda c: c.actions),
                      logprobs=cat(lambda c: c.logprobs), values=cat(lambda c: c.values),
                      rewards=cat(lambda c: c.rewards), dones=cat(lambda c: c.dones),
                      bootstrap=cat(lambda c: c.bootstrap), version=last.version, rank=last.rank,
                      start=chunks[0].start, final=last.final)


class StreamedGAE:
    """One rollout rank's chunks, in time order: GAE of every episode segment once it is complete."""

    def __init__(self, gamma: float, lam: float):
        self.gamma, self.lam = gamma, lam
        self.chunks: list[Trajectory] = []
        self.steps = 0
        self.adv, self.ret = torch.zeros(0), torch.zeros(0)
        self.done_to = torch.zeros(0, dtype=torch.long)  # per env: steps before this have their GAE

    def add(self, chunk: Trajectory) -> None:
        if self.chunks and self.chunks[-1].final:
            raise ValueError(f"rollout rank {chunk.rank}: a chunk after its final one")
        if chunk.start != self.steps:
            raise ValueError(f"rollout rank {chunk.rank}: chunk starts at step {chunk.start}, expected {self.steps}")
        if not self.chunks:
            n = chunk.rewards.shape[1]
            self.adv, self.ret, self.done_to = torch.zeros(0, n), torch.zeros(0, n), torch.zeros(n, dtype=torch.long)
        self.chunks.append(chunk)
        lo, hi = int(self.done_to.min()), self.steps + len(chunk.rewards)
        self.adv = torch.cat([self.adv, torch.zeros(chunk.rewards.shape)])
        self.ret = torch.cat([self.ret, torch.zeros(chunk.rewards.shape)])
        self.steps = hi
        window = join_chunks([c for c in self.chunks if c.start + len(c.rewards) > lo])
        cut = lo - window.start  # the window starts at a chunk boundary at or before lo
        dones = window.dones.bool()[cut:]
        if chunk.final:
            closed_to = torch.full_like(self.done_to, hi)
        else:  # up to each env's last episode end so far; an open episode waits for later chunks
            step = torch.arange(lo, hi)[:, None].expand_as(dones)
            closed_to = torch.where(dones, step + 1, 0).amax(0).maximum(self.done_to)
        if not bool((closed_to > self.done_to).any()):
            return
        adv, ret = episode_gae(window.rewards.float()[cut:], window.values.float()[cut:], dones,
                               window.bootstrap.float()[cut:], self.gamma, self.lam)
        t = torch.arange(lo, hi)[:, None]
        new = (t >= self.done_to) & (t < closed_to)  # [hi - lo, n]; steps before lo are all done
        self.adv[lo:hi] = torch.where(new, adv, self.adv[lo:hi])
        self.ret[lo:hi] = torch.where(new, ret, self.ret[lo:hi])
        self.done_to = closed_to

    @property
    def complete(self) -> bool:
        return bool(self.chunks) and self.chunks[-1].final

    def result(self) -> tuple[Trajectory, torch.Tensor, torch.Tensor]:
        if not self.complete:
            raise ValueError(f"rollout rank {self.chunks[0].rank if self.chunks else '?'}: no final chunk yet")
        return join_chunks(self.chunks), self.adv, self.ret


def ppo_batch(trajectories: list[Trajectory], gamma: float, lam: float) -> dict[str, torch.Tensor]:
    """Flat rows for the actor: obs fields, actions, old logprobs / values, advantages, returns."""
    return rows_batch([(traj, *trajectory_gae(traj, gamma, lam)) for traj in trajectories])


def rows_batch(items: list[tuple[Trajectory, torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """(trajectory, advantages, returns) per rank -> flat rows, in the given order."""
    rows: dict[str, list[torch.Tensor]] = {}
    for traj, adv, ret in items:
        fields = {**traj.obs, "actions": traj.actions, "old_logprobs": traj.logprobs, "old_values": traj.values,
                  "advantages": adv, "returns": ret}
        for k, v in fields.items():
            rows.setdefault(k, []).append(v.reshape(-1, *v.shape[2:]))
    return {k: torch.cat(v) for k, v in rows.items()}
