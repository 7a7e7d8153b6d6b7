"""ReplayWorker: the replay buffer as a worker. A receiving thread takes the `Transitions` chunks the rollout
ranks stream on a channel, at any time (while the learner trains, while this worker samples); the learner
reads sampled batches from another channel (`serve`).

Determinism (so a resumed run equals an uninterrupted one): received chunks are staged per round and enter
the buffer only at `seal(round, items)`, in rollout-rank order, once all of that round's chunks are in.
The learner of round k samples what was sealed up to round k - 1, while round k's chunks stream in. The
sampling RNG and the buffer are in `state()` (checkpointed with the run unless `runner.save_replay=false`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rlinf_like.data.replay import ReplayBuffer, Transitions
from rlinf_like.runtime import Channel, ChannelClosed, Worker

if TYPE_CHECKING:
    from rlinf_like.workers.actor.sac_learner import SACConfig

log = logging.getLogger(__name__)


@dataclass
class Samples:
    """Sampled batches for the learner, in order (`batches[i]`: obs, action, reward, discount, next_obs)."""

    batches: list[dict]


class ReplayWorker(Worker):
    def __init__(self, sac: SACConfig, obs_shape: tuple[int, ...], act_shape: tuple[int, ...], gamma: float,
                 seed: int):
        """`sac`: algorithm.sac (its buffer_size, n_step and the batch_size `serve` samples)."""
        self.sac = sac
        self.buffer = ReplayBuffer(sac.buffer_size, obs_shape, act_shape, gamma, sac.n_step)
        self.rng = np.random.default_rng(seed + 31_337)
        self._staged: list[Transitions] = []
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self.received = 0  # chunks taken off the channel
        self.received_at: list[float] = []  # when each chunk came in (the overlap test reads it)

    def start_receiving(self, channel: str) -> None:
        """Take chunks off `channel` in a background thread until it closes."""
        source = Channel.connect(channel)

        def receive() -> None:
            try:
                for item in source:
                    with self._cond:
                        self._staged.append(item)
                        self.received += 1
                        self.received_at.append(time.time())
                        self._cond.notify_all()
            except ChannelClosed:
                pass

        self._thread = threading.Thread(target=receive, name=f"{self.name} receive", daemon=True)
        self._thread.start()

    def seal(self, round: int, items: int, timeout: float = 600.0) -> int:
        """Wait for `items` chunks of `round`, add them in rank order; returns the stored transitions."""
        with self._cond:
            if not self._cond.wait_for(lambda: sum(t.round == round for t in self._staged) >= items, timeout):
                raise TimeoutError(f"{self.name}: {items} chunks of round {round} not in after {timeout:g}s")
            mine = [t for t in self._staged if t.round == round]
            self._staged = [t for t in self._staged if t.round != round]
        for item in sorted(mine, key=lambda t: t.rank):  # a stable sort: each rank's chunks stay in time order
            self.buffer.add(item)
        return len(self.buffer)

    def serve(self, count: int, channel: str, per_item: int = 16) -> float:
        """Sample `count` batches of algorithm.sac.batch_size now and put them on `channel`, `per_item` batches per
        item; returns the time spent (the learner trains on the first items while later ones are put)."""
        start, out = time.perf_counter(), Channel.connect(channel)
        batches = self.buffer.sample(self.sac.batch_size, count, self.rng)
        for i in range(0, count, per_item):
            out.put(Samples(batches[i:i + per_item]))
        return time.perf_counter() - start

    def stats(self) -> dict:
        with self._cond:
            return {"received": self.received, "received_at": list(self.received_at), "stored": len(self.buffer),
                    "staged": len(self._staged)}

    def state(self) -> dict:
        with self._cond:
            if self._staged:
                raise RuntimeError(f"{self.name}: state() with {len(self._staged)} chunks staged, not sealed")
        return {"buffer": self.buffer.state_dict(), "rng": self.rng.bit_generator.state}

    def load_state(self, state: dict) -> None:
        self.buffer.load_state_dict(state["buffer"])
        self.rng.bit_generator.state = state["rng"]
