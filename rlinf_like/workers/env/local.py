"""The env side of the wire, run inside the rollout worker's own process (`runner.env_in_rollout`).

For a cheap simulator (Reacher: ~60 us per env step) the per-step handoff between an env worker
and its rollout rank (two process wake-ups over gloo, ~3 ms on 2 busy cores) costs more than the
step itself. `LocalEnvLink` has the rollout's side of `Link` (`recv_step`, `send`, `flush`), so the
rollout's collect loop is unchanged: `send(actions)` steps the envs at once and `recv_step` hands back
that step's `StepMessage` as an env worker sends it (the same values), so a run with the envs inside
the rollout produces the same data as one over the wire.
"""

from __future__ import annotations

import time

import numpy as np

from rlinf_like.envs import EnvConfig, EpisodeStats, make_env
from rlinf_like.workers.env.link import Layout
from rlinf_like.workers.env.types import EnvSpecs, EnvStats, StepMessage


class LocalEnvLink:
    def __init__(self, config: EnvConfig, seed: int, name: str):
        self.env = make_env(config, config.num_envs, name)
        self.obs = self.env.reset(seed)  # env i gets seed + i, as in an env worker
        self.n = config.num_envs
        self._pending: StepMessage | None = None
        self.episodes: list[EpisodeStats] = []
        self.busy_s, self.steps = 0.0, 0

    def specs(self) -> EnvSpecs:
        return EnvSpecs(self.env.obs_spec, self.env.action_spec, envs_per_stage=self.n, stages=1)

    def recv_step(self, layout: Layout | None = None, obs_keys=None) -> StepMessage:
        """The last step's message; before any step of a collect, the current observation alone.
        (`layout` and `obs_keys` are the wire's: unused, no bytes to decode here.)"""
        msg, self._pending = self._pending, None
        return msg if msg is not None else StepMessage.first(self.obs, self.n)

    def send(self, layout: Layout | None, values: dict[str, np.ndarray]) -> None:
        t0 = time.perf_counter()
        result = self.env.step(values["actions"])
        self.busy_s += time.perf_counter() - t0
        self.obs, self.steps = result.obs, self.steps + self.n
        self.episodes += result.episodes
        self._pending = StepMessage.after(result)

    def flush(self, keep: int = 0) -> None:
        pass

    def take_stats(self) -> EnvStats:
        """What an env worker's `collect` returns (no wall time: it is the rollout's), then reset."""
        out = EnvStats(self.episodes, self.busy_s, self.steps)
        self.episodes, self.busy_s, self.steps = [], 0.0, 0
        return out
