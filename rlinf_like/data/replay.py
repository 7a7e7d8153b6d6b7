"""A preallocated ring buffer of transitions for off-policy learning, fed time-major chunks of steps.

`Transitions` is what a rollout rank streams: T steps of its n envs (obs, action, reward, the next obs to
bootstrap from, terminated, truncated). `ReplayBuffer.add` folds each env's steps into n-step transitions
(`algorithms.sac.fold_n_step`): a window of n steps is emitted when full, and every open window is flushed at
an episode end (a terminal cuts the return; a time-limit truncation bootstraps from the final obs). Stored per
transition: obs, action, the folded reward, `discount` = gamma^k x (1 - terminated), and the next obs.
Sampling is uniform over what is stored, with a caller's numpy Generator (checkpointed by its owner).

An observation is one array (built from a shape: float32) or a dict of named fields (built from the env's
`FieldSpec`s, each in its own dtype: a pixel frame stays uint8); `tree_map` treats both alike.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlinf_like.algorithms.sac import fold_n_step
from rlinf_like.envs.base import FieldSpec

Obs = Any  # np.ndarray | dict[str, np.ndarray] (or the tensors sampled from them)


def tree_map(fn: Callable, *trees: Obs) -> Obs:
    """fn over the arrays of one or more observations of the same structure (an array or a dict of them)."""
    if isinstance(trees[0], dict):
        return {k: fn(*(t[k] for t in trees)) for k in trees[0]}
    return fn(*trees)


def _assign(dst: Obs, index, src: Obs) -> None:
    if isinstance(dst, dict):
        for k in dst:
            dst[k][index] = src[k]
    else:
        dst[index] = src


@dataclass
class Transitions:
    obs: Obs  # [T, n, *obs] (per field for a dict)
    action: np.ndarray  # [T, n, *act]: the policy's actions (SAC: in [-1, 1]; discrete SAC: token ids)
    reward: np.ndarray  # [T, n]
    next_obs: Obs  # [T, n, *obs]: after the step; a finished episode's last obs (not the reset's)
    terminated: np.ndarray  # [T, n] bool
    truncated: np.ndarray  # [T, n] bool
    rank: int = 0  # the rollout rank that collected it
    round: int = 0  # the runner's round it belongs to


FIELDS = ("obs", "action", "reward", "discount", "next_obs")  # a stored transition; a sampled batch's keys


class ReplayBuffer:
    def __init__(self, capacity: int, obs_shape: tuple[int, ...] | dict[str, FieldSpec], act_shape: tuple[int, ...],
                 gamma: float, n_step: int = 1):
        self.capacity, self.gamma, self.n_step = capacity, gamma, n_step

        def alloc() -> Obs:
            if isinstance(obs_shape, dict):
                return {k: np.zeros((capacity, *f.shape), f.dtype) for k, f in obs_shape.items()}
            return np.zeros((capacity, *obs_shape), np.float32)

        self.obs, self.next_obs = alloc(), alloc()
        self.action = np.zeros((capacity, *act_shape), np.float32)
        self.reward = np.zeros(capacity, np.float32)
        self.discount = np.zeros(capacity, np.float32)
        self.added = 0  # transitions ever stored; slot = added % capacity
        self._windows: dict[tuple[int, int], deque] = {}  # (rank, env) -> its open n-step window

    def __len__(self) -> int:
        return min(self.added, self.capacity)

    def _store(self, obs, action, reward: float, discount: float, next_obs) -> None:
        i = self.added % self.capacity
        _assign(self.obs, i, obs)
        _assign(self.next_obs, i, next_obs)
        self.action[i], self.reward[i], self.discount[i] = action, reward, discount
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
            rows = lambda x: x.reshape(m, *x.shape[2:])  # noqa: E731
            _assign(self.obs, slots, tree_map(rows, t.obs))
            _assign(self.next_obs, slots, tree_map(rows, t.next_obs))
            self.action[slots] = t.action.reshape(m, *t.action.shape[2:])
            self.reward[slots] = t.reward.reshape(m)
            self.discount[slots] = np.where(t.terminated.reshape(m), 0.0, self.gamma)
            self.added += m
            return
        for step in range(t.reward.shape[0]):
            for env in range(t.reward.shape[1]):
                window = self._windows.setdefault((t.rank, env), deque())
                at = lambda x: x[step, env]  # noqa: E731
                window.append((tree_map(at, t.obs), t.action[step, env], float(t.reward[step, env]),
                               tree_map(at, t.next_obs), bool(t.terminated[step, env])))
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
        gathered = {k: tree_map(lambda v: torch.from_numpy(v[idx]), getattr(self, k)) for k in FIELDS}
        return [{k: tree_map(lambda v: v[c], v) for k, v in gathered.items()} for c in range(count)]

    def state_dict(self) -> dict:
        n = len(self)
        return {"added": self.added, "windows": {k: list(w) for k, w in self._windows.items()},
                **{k: tree_map(lambda v: v[:n].copy(), getattr(self, k)) for k in FIELDS}}

    def load_state_dict(self, state: dict) -> None:
        n = len(state["reward"])
        for k in FIELDS:
            _assign(getattr(self, k), slice(0, n), state[k])
        self.added = state["added"]
        self._windows = {k: deque(v) for k, v in state["windows"].items()}
