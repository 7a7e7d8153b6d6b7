"""EnvWorker: one rank of the env group, holding its environments as `stages` vector envs.

Two ways to drive it. Directly (`reset`, `step`: one call per step, for tests and tools). Or over
the wire to its rollout rank (`connect_rollout`, then `collect(steps)`): the worker sends every
stage's observation, then for each step and stage receives that stage's actions, steps it and
sends the result back. With 2 stages the rollout infers stage 1 while this worker steps stage 0:
simulator and policy overlap (pipeline mode); with 1 stage they take turns.
"""

from __future__ import annotations

import time

import numpy as np

from rlinf_like.data.episode_groups import group_seeds
from rlinf_like.envs import EnvConfig, EpisodeStats, Obs, StepResult, make_env
from rlinf_like.runtime import Worker
from rlinf_like.workers.env.link import Link, action_layout, step_layout
from rlinf_like.workers.env.types import EnvSpecs, EnvStats, StepMessage


class EnvWorker(Worker):
    def __init__(self, config: EnvConfig, stages: int = 1, seed: int = 0):
        if stages < 1 or config.num_envs % stages:
            raise ValueError(f"env worker {self.name}: env.num_envs={config.num_envs} does not split into "
                             f"{stages} pipeline stages")
        per_stage = config.num_envs // stages
        label = f"env worker {self.name}"
        self.envs = [make_env(config, per_stage, f"{label} stage {s}") for s in range(stages)]
        self.seed = seed + self.rank * config.num_envs
        self.per_stage = per_stage
        self.obs: list[Obs] = [env.reset(self.seed + s * per_stage) for s, env in enumerate(self.envs)]
        self._link: Link | None = None

    def specs(self) -> EnvSpecs:
        env = self.envs[0]
        return EnvSpecs(env.obs_spec, env.action_spec, envs_per_stage=self.per_stage, stages=len(self.envs))

    # --- direct driving ----------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> list[Obs]:
        base = self.seed if seed is None else seed
        self.obs = [env.reset(base + s * self.per_stage) for s, env in enumerate(self.envs)]
        return self.obs

    def reset_groups(self, seed: int, group_size: int) -> list[Obs]:
        """Reset every env so each `group_size` consecutive envs (global order: rank, stage, env) share a seed."""
        first = self.rank * self.per_stage * len(self.envs)
        self.obs = [env.reset_seeds(group_seeds(seed, first + s * self.per_stage, self.per_stage, group_size))
                    for s, env in enumerate(self.envs)]
        return self.obs

    def step(self, actions: np.ndarray, stage: int = 0) -> StepResult:
        result = self.envs[stage].step(actions)
        self.obs[stage] = result.obs
        return result

    # --- checkpoints ------------------------------------------------------------------------------
    def get_state(self) -> dict:
        """Every stage's env state (sim, RNG, episode counters) and current obs, for a checkpoint."""
        return {"stages": [env.get_state() for env in self.envs], "obs": self.obs}

    def set_state(self, state: dict) -> None:
        if len(state["stages"]) != len(self.envs):
            raise ValueError(f"env worker {self.name}: the saved state has {len(state['stages'])} pipeline stages, "
                             f"this worker {len(self.envs)}")
        for env, saved in zip(self.envs, state["stages"]):
            env.set_state(saved)
        self.obs = state["obs"]

    # --- over the wire to a rollout rank -----------------------------------------------------------
    def connect_rollout(self, peer_group: str, rollout_peer_rank: int) -> None:
        self._link = Link(self.peer_group(peer_group), rollout_peer_rank)

    def collect(self, steps: int, action_shape: tuple[int, ...]) -> EnvStats:
        """Serve `steps` steps of every stage to the rollout; returns finished episodes and timings."""
        if self._link is None:
            raise RuntimeError(f"env worker {self.name}: collect before connect_rollout")
        spec, n = self.envs[0].obs_spec, self.per_stage
        msg_layout, act_layout = step_layout(spec, n), action_layout((n, *action_shape))
        start, busy, episodes = time.perf_counter(), 0.0, []
        for s in range(len(self.envs)):
            self._link.send_step(msg_layout, StepMessage.first(self.obs[s], n))
        for _ in range(steps):
            for s, env in enumerate(self.envs):
                actions = self._link.recv(act_layout)["actions"]
                t0 = time.perf_counter()
                result = self.step(actions, s)
                busy += time.perf_counter() - t0
                episodes += result.episodes
                self._link.send_step(msg_layout, StepMessage.after(result))
        self._link.flush()
        return EnvStats(episodes, busy, steps * n * len(self.envs), wall_s=time.perf_counter() - start)

    def render(self, stage: int = 0, index: int = 0) -> np.ndarray | None:
        env = self.envs[stage]
        return env.frame(index) if hasattr(env, "frame") else env.render(index)


def episode_metrics(episodes: list[EpisodeStats]) -> dict[str, float]:
    if not episodes:
        return {}
    out = {"episode_return": float(np.mean([e.ret for e in episodes])),
           "episode_length": float(np.mean([e.length for e in episodes])), "episodes": float(len(episodes))}
    successes = [e.success for e in episodes if e.success is not None]
    if successes:
        out["success_rate"] = float(np.mean(successes))
    return out
