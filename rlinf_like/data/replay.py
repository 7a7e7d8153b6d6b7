"""A preallocated ring buffer of transitions for off-policy learning, fed time-major chunks of steps.

`Transitions` is what a rollout rank streams: T steps of its n envs (obs, action, reward, the next obs to
bootstrap from, terminated, truncated). `ReplayBuffer.add` folds each env's steps into n-step transitions
(`algorithms.sac.fold_n_step`): a window of n steps is emitted when full, and every open window is flushed at
an episode end (a terminal cuts the return; a time-limit truncation bootstraps from the final obs). Stored per
transition: obs, action, the folded reward, `discount` = gamma^k x (1 - terminated), and the next obs.
Sampling is uniform over what is stored, with a caller's numpy Generator (checkpointed by its owner).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from rlinf_like.algorithms.sac import fold_n_step


@dataclass
class Transitions:
    obs: np.ndarray  # [T, n, *obs]
    action: np.ndarray  # [T, n, *act]: the policy's actions (SAC: in [-1, 1])
    reward: np.ndarray  # [T, n]
    next_obs: np.ndarray  # [T, n, *obs]: after the step; a finished episode's last obs (not the reset's)
    terminated: np.ndarray  # [T, n] bool
    truncated: np.ndarray  # [T, n] bool
    rank: int = 0  # the rollout rank that collected it
    round: int = 0  # the runner's round it belongs to


class ReplayBuffer:
    def __init__(self, capacity: int, obs_shape: tuple[int, ...], act_shape: tuple[int, ...], gamma: float,
                 n_step: int = 1):
        self.capacity, self.gamma, self.n_step = capacity, gamma, n_step
        self.obs = np.zeros((capacity, *obs_shape), np.float32)
        self.next_obs = np.zeros((capacity, *obs_shape), np.float32)
        self.action = np.zeros((capacity, *act_shape), np.float32)
        self.reward = np.zeros(capacity, np.float32)
        self.discount = np.zeros(capacity, np.float32)
        self.added = 0  # transitions ever stored; slot = added % capacity
        self._windows: dict[tuple[int, int], deque] = {}  # (rank, env) -> its open n-step window

    def __len__(self) -> int:
        return min(self.added, self.capacity)

    def _store(self, obs, action, reward: float, discount: float, next_obs) -> None:
        i = self.added % self.capacity
        self.obs[i], self.action[i], self.reward[i], self.discount[i], self.next_obs[i] = (
            obs, action, reward, discount, next_obs)
        self.added += 1

    def _emit(self, window: deque) -> None:
        """The n-step transition starting at the window's oldest step."""
        steps = list(window)
        rewards = np.array([s[2] for s in steps])
        terms = np.array([s[4] for s in steps])
        ret, term, k = fold_n_step(rewards, terms, self.gamma)
        first, last = steps[0], steps[k - 1]
        self._store(first[0], first[1], ret, 0.0 if term else self.gamma ** k, last[3])

    def add(self, t: Transitions) -> None:
        if self.n_step == 1:  # the common case, vectorised: every step is a transition
            m = t.reward.size
            slots = (self.added + np.arange(m)) % self.capacity
            self.obs[slots] = t.obs.reshape(m, *t.obs.shape[2:])
            self.action[slots] = t.action.reshape(m, *t.action.shape[2:])
            self.reward[slots] = t.reward.reshape(m)
            self.discount[slots] = np.where(t.terminated.reshape(m), 0.0, self.gamma)
            self.next_obs[slots] = t.next_obs.reshape(m, *t.next_obs.shape[2:])
            self.added += m
            return
        for step in range(t.reward.shape[0]):
            for env in range(t.reward.shape[1]):
                window = self._windows.setdefault((t.rank, env), deque())
                window.append((t.obs[step, env], t.action[step, env], float(t.reward[step, env]),
                               t.next_obs[step, env], bool(t.terminated[step, env])))
                if t.terminated[step, env] or t.truncated[step, env]:
                    while window:  # the episode ended: every open start is emitted, shorter than n
                        self._emit(window)
                        window.popleft()
                elif len(window) == self.n_step:
                    self._emit(window)
                    window.popleft()

    def sample(self, batch_size: int, count: int, rng: np.random.Generator) -> list[dict[str, torch.Tensor]]:
        """`count` batches of `batch_size` transitions drawn uniformly (with replacement) from what is stored."""
        if len(self) == 0:
            raise ValueError("sample from an empty replay buffer")
        idx = rng.integers(0, len(self), size=(count, batch_size))
        fields = {"obs": self.obs, "action": self.action, "reward": self.reward, "discount": self.discount,
                  "next_obs": self.next_obs}
        gathered = {k: torch.from_numpy(v[idx]) for k, v in fields.items()}
        return [{k: v[c] for k, v in gathered.items()} for c in range(count)]

    def state_dict(self) -> dict:
        n = len(self)
        return {"added": self.added, "windows": {k: list(w) for k, w in self._windows.items()},
                **{k: getattr(self, k)[:n].copy() for k in ("obs", "next_obs", "action", "reward", "discount")}}

    def load_state_dict(self, state: dict) -> None:
        n = len(state["reward"])
        for k in ("obs", "next_obs", "action", "reward", "discount"):
            getattr(self, k)[:n] = state[k]
        self.added = state["added"]
        self._windows = {k: deque(v) for k, v in state["windows"].items()}
