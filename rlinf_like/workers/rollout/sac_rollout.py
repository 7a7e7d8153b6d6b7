"""SACRolloutWorker: the rollout of off-policy runs. It serves its envs as `PolicyRolloutWorker` does (over
the wire to env workers, or envs in its own process), acting with SAC's actor (uniform random actions during
the warm-up), and streams every finished step as a transition (obs, action, reward, the step's last obs,
terminated, truncated) to the replay worker's channel in chunks of `chunk_steps` steps while it collects.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from rlinf_like.data.replay import Transitions
from rlinf_like.envs import ActionSpec, FieldSpec
from rlinf_like.models.sac import SACRolloutPolicy
from rlinf_like.scheduler import Channel
from rlinf_like.workers.env.link import action_layout, step_layout
from rlinf_like.workers.env.types import CollectResult
from rlinf_like.workers.rollout.policy_worker import PolicyRolloutWorker


class SACRolloutWorker(PolicyRolloutWorker):
    def __init__(self, obs_spec: dict[str, FieldSpec], action: ActionSpec, hidden: list[int], seed: int = 0):
        # PolicyRolloutWorker's state, with SAC's actor as the policy (no policy-registry network)
        torch.manual_seed(seed + 7919 * (self.rank + 1))
        self.policy = SACRolloutPolicy(int(np.prod(obs_spec["state"].shape)), action, hidden).eval()
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
        act_dim = self.policy.low.numel()
        msg_layout, act_layout = step_layout(self.obs_spec, envs_per_stage), action_layout((envs_per_stage, act_dim))
        streams = [link for link in self._links for _ in range(stages)]
        pending: list[tuple[np.ndarray, np.ndarray] | None] = [None] * len(streams)  # (obs, action) awaiting outcome
        done: list[list[tuple]] = [[] for _ in streams]  # per stream: finished transitions, in time order
        out, start, busy, puts, sent = Channel.connect(channel), time.perf_counter(), 0.0, 0, 0

        def put(upto: int) -> None:
            nonlocal puts, sent
            rows = [d[sent:upto] for d in done]  # [stream][step] -> time-major [T, all envs]
            field = lambda j: np.stack([np.concatenate([r[t][j] for r in rows]) for t in range(upto - sent)])  # noqa: E731
            out.put(Transitions(field(0), field(1), field(2), field(3), field(4), field(5), self.rank, round))
            puts, sent = puts + 1, upto

        for t in range(steps + 1):
            for s, link in enumerate(streams):
                msg = link.recv_step(msg_layout, self.obs_spec)
                if pending[s] is not None:
                    obs, act = pending[s]
                    done[s].append((obs, act, msg.reward.copy(), np.array(msg.final_obs["state"]),
                                    msg.terminated.copy(), msg.truncated.copy()))
                if t == steps:
                    link.flush()
                    continue
                t0 = time.perf_counter()
                state = np.array(msg.obs["state"])
                actions = self.policy({"state": torch.from_numpy(state)})[0]
                env_actions = self.policy.env_actions(actions)
                busy += time.perf_counter() - t0
                link.send(act_layout, {"actions": env_actions})
                pending[s] = (state, actions.numpy())
            if t and (t - sent == chunk_steps or t == steps):
                put(t)
        local = self._local_envs()
        result = CollectResult(busy, time.perf_counter() - start, env=local[0].take_stats() if local else None)
        return result, puts
