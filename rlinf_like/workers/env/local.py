"""The env side of the wire, run inside the rollout worker's own process (`runner.env_in_rollout`).

For a cheap simulator (Reacher: ~60 us per env step) the per-step handoff between an env worker
and its rollout rank (two process wake-ups over gloo, ~3 ms on 2 busy cores) costs more than the
step itself. `LocalEnvLink` has the rollout's side of `Link` (`recv`, `send`, `flush`), so the
rollout's collect loop is unchanged: `send(actions)` steps the envs at once and `recv` hands back
that step's message as `step_message` builds it for the wire (the same fields and values, unpacked),
so a run with the envs inside the rollout produces the same data as one over the wire.
"""

from __future__ import annotations

import time

import numpy as np

from rlinf_like.envs import EnvConfig, EpisodeStats, make_env
from rlinf_like.workers.env.link import Layout, step_message


class LocalEnvLink:
    def __init__(self, config: EnvConfig, seed: int, name: str):
        self.env = make_env(config, config.num_envs, name)
        self.obs = self.env.reset(seed)  # env i gets seed + i, as in an env worker
        self.n = config.num_envs
        self._pending: dict[str, np.ndarray] | None = None
        self.episodes: list[EpisodeStats] = []
        self.busy_s, self.steps = 0.0, 0

    def specs(self) -> dict:
        return {"obs_spec": self.env.obs_spec, "action_spec": self.env.action_spec, "envs_per_stage": self.n,
                "stages": 1}

    def recv(self, layout: Layout | None = None) -> dict[str, np.ndarray]:
        """The last step's message; before any step of a collect, the current observation alone."""
        msg, self._pending = self._pending, None
        return msg if msg is not None else step_message(self.obs, None, self.n)

    def send(self, layout: Layout | None, values: dict[str, np.ndarray]) -> None:
        t0 = time.perf_counter()
        result = self.env.step(values["actions"])
        self.busy_s += time.perf_counter() - t0
        self.obs, self.steps = result.obs, self.steps + self.n
        self.episodes += result.episodes
        self._pending = step_message(result.obs, result, self.n)

    def flush(self, keep: int = 0) -> None:
        pass

    def take_stats(self) -> dict:
        """What an env worker's `collect` returns: finished episodes, env busy time, env steps (then reset)."""
        out = {"episodes": self.episodes, "env_busy_s": self.busy_s, "env_steps": self.steps}
        self.episodes, self.busy_s, self.steps = [], 0.0, 0
        return out
