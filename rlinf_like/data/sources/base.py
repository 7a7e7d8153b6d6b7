"""What a data source returns (`Tasks`) and declares (`DataSource`), and the RL steps' draw."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from rlinf_like.data.tasks import Problem


@dataclass(kw_only=True)
class Tasks:
    sft: list[Problem]  # SFT warm-start set
    test: list[Problem]  # held out, greedy evaluation
    pool: list[Problem]  # what RL steps draw from
    # True: steps walk the pool in seeded epochs, each problem once per epoch (a dataset). False: each
    # step draws with replacement (the pool is a sample of a generator's endless stream)
    epochs: bool

    def draw(self, step: int, n: int, rng: random.Random, seed: int) -> list[Problem]:
        """Step `step`'s `n` problems: a function of the step alone (with `rng` seeded by the step), so a
        resumed run draws what the uninterrupted run would have, mid-epoch or at an epoch boundary."""
        if not self.epochs:
            return [rng.choice(self.pool) for _ in range(n)]
        return [self.pool[i] for i in epoch_order(len(self.pool), range(step * n, (step + 1) * n), seed)]


def epoch_order(size: int, positions: range, seed: int) -> list[int]:
    """The pool indices at `positions` of the endless sequence epoch 0, epoch 1, ..., each epoch a
    permutation of range(size) seeded by (seed, epoch)."""
    out, perms = [], {}
    for pos in positions:
        epoch = pos // size
        if epoch not in perms:
            perms[epoch] = random.Random(seed * 1_000_003 + epoch).sample(range(size), size)
        out.append(perms[epoch][pos % size])
    return out


class DataSource:
    """A data source: `load(cfg)` reads the `data` section and returns `Tasks`, raising ValueError (naming
    the file, row and key) on bad data."""

    keys: ClassVar[tuple[str, ...]]  # the data.* keys it reads, beyond source, seed and the prompt format
    default_reward: ClassVar[str]  # the reward.fn that reward.fn=auto means with this source

    @classmethod
    def load(cls, cfg) -> Tasks:
        raise NotImplementedError
