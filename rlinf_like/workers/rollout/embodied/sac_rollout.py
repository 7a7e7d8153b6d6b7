"""SACRolloutWorker: the rollout of off-policy runs. It serves its envs as `PolicyRolloutWorker` does (over
the wire to env workers, or envs in its own process), acting with SAC's actor (uniform random actions during
the warm-up), and streams every finished step as a transition (obs, action, reward, the step's last obs,
terminated, truncated) to the replay worker's channel in chunks of `chunk_steps` steps while it collects.
The actor is built by `build` (continuous SAC's `SACRolloutPolicy`, discrete SAC's `TokenPolicy`); the
observations streamed are the fields it reads (`obs_keys`), its actions what it returns (`action_shape`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from rlinf_like.data.replay import Transitions, tree_map
from rlinf_like.envs import FieldSpec
from rlinf_like.runtime import Channel
from rlinf_like.workers.env.link import action_layout, step_layout
from rlinf_like.workers.env.types import CollectResult
from rlinf_like.workers.rollout.embodied.policy_worker import PolicyRolloutWorker


class SACRolloutWorker(PolicyRolloutWorker):
    def __init__(self, obs_spec: dict[str, FieldSpec], env_action_shape: tuple[int, ...], build: Callable[[], nn.Module],
                 seed: int = 0):
        # PolicyRolloutWorker's state, with SAC's actor as the policy
        torch.manual_seed(seed + 7919 * (self.rank + 1))
        self.policy = build().eval()
        self._own_sampling(seed)
        self.env_action_shape = env_action_shape
        self.obs_spec = obs_spec
        self.version = 0
        self._receiver = None
        self._links = []

    def load_policy(self, state: dict[str, torch.Tensor]) -> None:
        """The weights the rollout acted with at a checkpoint (they may be older than the learner's)."""
        self.policy.load_state_dict(state)

    @torch.no_grad()
    def collect_transitions(self, steps: int, stages: int, envs_per_stage: int, channel: str, round: int,
                            random_actions: bool, chunk_steps: int) -> tuple[CollectResult, int]:
        """`steps` steps of every (env rank, stage); returns the stats and how many chunks went on `channel`."""
        if not self._links:
            raise RuntimeError(f"{self.name}: collect before connect_envs or attach_envs")
        self.policy.random_actions = random_actions
        keys = self.policy.obs_keys
        msg_layout = step_layout(self.obs_spec, envs_per_stage)
        act_layout = action_layout((envs_per_stage, *self.env_action_shape))
        streams = [link for link in self._links for _ in range(stages)]
        pending: list[tuple[dict, np.ndarray] | None] = [None] * len(streams)  # (obs, action) awaiting outcome
        done: list[list[tuple]] = [[] for _ in streams]  # per stream: finished transitions, in time order
        out, start, busy, puts, sent = Channel.connect(channel), time.perf_counter(), 0.0, 0, 0

        def put(upto: int) -> None:
            nonlocal puts, sent
            rows = [d[sent:upto] for d in done]  # [stream][step] -> time-major [T, all envs]
            stack = lambda *steps: np.stack(steps)  # noqa: E731
            envs = lambda *streams: np.concatenate(streams)  # noqa: E731
            field = lambda j: tree_map(stack, *[tree_map(envs, *[r[t][j] for r in rows])  # noqa: E731
                                                for t in range(upto - sent)])
            out.put(Transitions(field(0), field(1), field(2), field(3), field(4), field(5), self.rank, round))
            puts, sent = puts + 1, upto

        for t in range(steps + 1):
            for s, link in enumerate(streams):
                msg = link.recv_step(msg_layout, self.obs_spec)
                if pending[s] is not None:
                    obs, act = pending[s]
                    done[s].append((obs, act, msg.reward.copy(), {k: np.array(msg.final_obs[k]) for k in keys},
                                    msg.terminated.copy(), msg.truncated.copy()))
                if t == steps:
                    link.flush()
                    continue
                t0 = time.perf_counter()
                state = {k: np.array(msg.obs[k]) for k in keys}
                actions = self.policy({k: torch.from_numpy(v) for k, v in state.items()})[0]
                env_actions = self.policy.env_actions(actions)
                busy += time.perf_counter() - t0
                link.send(act_layout, {"actions": env_actions})
                pending[s] = (state, actions.numpy())
            if t and (t - sent == chunk_steps or t == steps):
                put(t)
        local = self._local_envs()
        result = CollectResult(busy, time.perf_counter() - start, env=local[0].take_stats() if local else None)
        return result, puts
