"""SAC in one process: the same env adapter (`VectorEnv`), replay buffer and learner as the worker runner
(`runners/embodied/sac.py`), stepped in turn (act, step, store, `utd` updates). For the learning tests and the
SB3 comparison (`bench/sac_vs_sb3.py`), where SB3 also runs in one process.
`policy` set: discrete SAC with that registered policy (`DiscreteSACLearner`); else the continuous SAC.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from rlinf_like.data.replay import ReplayBuffer, Transitions
from rlinf_like.envs import EnvConfig, make_env
from rlinf_like.models.policy_base import PolicyConfig
from rlinf_like.workers.actor.discrete_sac_learner import DiscreteSACLearner
from rlinf_like.workers.actor.sac_learner import SACConfig, SACLearner, SoftLearner


@dataclass(kw_only=True)
class LocalSACResult:
    episode_returns: list[float] = field(default_factory=list)  # in the order they finished
    env_steps: int = 0
    updates: int = 0
    wall_s: float = 0.0
    learner: SoftLearner | None = None


def run_local_sac(env: EnvConfig, sac: SACConfig, *, total_env_steps: int, hidden: list[int], gamma: float = 0.99,
                  lr: float = 3e-4, seed: int = 0, adam_eps: float = 1e-8,
                  policy: PolicyConfig | None = None) -> LocalSACResult:
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    envs = make_env(env, env.num_envs, "sac env")
    spec, n = envs.action_spec, env.num_envs
    if policy is not None:
        learner: SoftLearner = DiscreteSACLearner(policy, envs.obs_spec, spec, sac, gamma, lr, adam_eps)
    elif spec.kind != "continuous":
        raise ValueError(f"algorithm.name=sac takes continuous actions; env {env.id} has {spec.kind} ones "
                         "(algorithm.name=discrete_sac acts in discrete ones)")
    else:
        learner = SACLearner(int(np.prod(envs.obs_spec["state"].shape)), spec, hidden, sac, gamma, lr, adam_eps)
    actor = learner.policy
    fields = {k: envs.obs_spec[k] for k in actor.obs_keys}
    buffer = ReplayBuffer(sac.buffer_size, fields, actor.action_shape, gamma, sac.n_step)
    pick = lambda o: {k: np.asarray(o[k]) for k in fields}  # noqa: E731
    obs = pick(envs.reset(seed))
    out, start, owed = LocalSACResult(learner=learner), time.perf_counter(), 0.0
    while out.env_steps < total_env_steps:
        actor.random_actions = out.env_steps < sac.learning_starts
        with torch.no_grad():
            action = actor({k: torch.from_numpy(v) for k, v in obs.items()})[0]
        result = envs.step(actor.env_actions(action))
        buffer.add(Transitions({k: v[None] for k, v in obs.items()}, action.numpy()[None], result.rewards[None],
                               {k: v[None] for k, v in pick(result.final_obs).items()}, result.terminated[None],
                               result.truncated[None]))
        obs = pick(result.obs)
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
