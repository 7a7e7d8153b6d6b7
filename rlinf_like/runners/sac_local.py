"""SAC in one process: the same env adapter (`VectorEnv`), replay buffer and learner as the worker runner
(`runners/embodied_sac.py`), stepped in turn (act, step, store, `utd` updates). For the learning test and the
SB3 comparison (`bench/sac_vs_sb3.py`), where SB3 also runs in one process; and for users without Ray.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from rlinf_like.data.replay import ReplayBuffer, Transitions
from rlinf_like.envs import EnvConfig, make_env
from rlinf_like.workers.actor.sac_learner import SACConfig, SACLearner


@dataclass(kw_only=True)
class LocalSACResult:
    episode_returns: list[float] = field(default_factory=list)  # in the order they finished
    env_steps: int = 0
    updates: int = 0
    wall_s: float = 0.0
    learner: SACLearner | None = None


def run_local_sac(env: EnvConfig, sac: SACConfig, *, total_env_steps: int, hidden: list[int], gamma: float = 0.99,
                  lr: float = 3e-4, seed: int = 0, adam_eps: float = 1e-8) -> LocalSACResult:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    envs = make_env(env, env.num_envs, "sac env")
    spec, n = envs.action_spec, env.num_envs
    if spec.kind != "continuous":
        raise ValueError(f"algorithm.name=sac takes continuous actions; env {env.id} has {spec.kind} ones")
    obs_shape = envs.obs_spec["state"].shape
    learner = SACLearner(int(np.prod(obs_shape)), spec, hidden, sac, gamma, lr, adam_eps)
    buffer = ReplayBuffer(sac.buffer_size, obs_shape, (len(spec.low),), gamma, sac.n_step)
    policy = learner.policy
    obs = envs.reset(seed)["state"]
    out, start, owed = LocalSACResult(learner=learner), time.perf_counter(), 0.0
    while out.env_steps < total_env_steps:
        policy.random_actions = out.env_steps < sac.learning_starts
        with torch.no_grad():
            action = policy({"state": torch.from_numpy(obs)})[0]
        result = envs.step(policy.env_actions(action))
        buffer.add(Transitions(obs[None], action.numpy()[None], result.rewards[None], result.final_obs["state"][None],
                               result.terminated[None], result.truncated[None]))
        obs = result.obs["state"]
        out.env_steps += n
        out.episode_returns += [e.ret for e in result.episodes]
        if out.env_steps > sac.learning_starts:  # as SB3: the first update after learning_starts steps
            owed += sac.utd * n
            count = int(owed)
            owed -= count
            if count:
                for batch in buffer.sample(sac.batch_size, count, rng):
                    learner.update(batch)
                out.updates += count
    envs.close()
    out.wall_s = time.perf_counter() - start
    return out
