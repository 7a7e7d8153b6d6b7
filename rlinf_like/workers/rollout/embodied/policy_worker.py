"""PolicyRolloutWorker: batched policy inference for embodied RL (actions, logprobs, values).

It holds a plain copy of the policy, receives the actor's weights through the hybrid engine's
weight sync (`connect_weights` once, `apply_weights(version)` each iteration), and serves its env
ranks over the wire (`connect_envs`, `collect`). For every step it takes each (env rank, stage) in
turn: receive the observation, infer, send the actions. With two stages per env worker, the env
steps one stage while this worker infers the other. At the end it returns (or puts on a channel)
one `Trajectory` of its envs with the values needed for bootstrapping; with `chunk_steps` (streaming) it
puts each `chunk_steps` steps on the channel as soon as the step after them is inferred (their
bootstrap needs its values), so the actor starts on them while collection goes on. With `attach_envs` the envs
live in this process instead (`workers/env/local.py`): the same loop, no env worker, no per-step handoff.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from rlinf_like.data.episode_groups import group_seeds
from rlinf_like.data.trajectory import Trajectory
from rlinf_like.envs import ActionSpec, EnvConfig, FieldSpec
from rlinf_like.hybrid_engines.reshard import SyncPlan, TensorLayout, WeightReceiver, replicated
from rlinf_like.models.policies import PolicyConfig, build_policy
from rlinf_like.models.policy_base import use_generator
from rlinf_like.runtime import Channel, Worker
from rlinf_like.workers.env.link import Link, action_layout, step_layout
from rlinf_like.workers.env.local import LocalEnvLink
from rlinf_like.workers.env.types import CollectResult, EnvSpecs, StepMessage


def _tensors(obs: dict[str, np.ndarray], keys) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(np.array(obs[k])) for k in keys}


class _Stream:
    """Per (env rank, stage) buffers of one collect."""

    def __init__(self, link: Link):
        self.link = link
        self.obs: dict[str, list[torch.Tensor]] = {}
        self.actions, self.logprobs, self.values = [], [], []
        self.rewards, self.terminated, self.truncated, self.final_values = [], [], [], []


class PolicyRolloutWorker(Worker):
    def __init__(self, policy: PolicyConfig, obs_spec: dict[str, FieldSpec], action: ActionSpec, seed: int = 0):
        torch.manual_seed(seed + 7919 * (self.rank + 1))
        self.policy = build_policy(policy, obs_spec, action).eval()
        self._own_sampling(seed)
        self.obs_spec = obs_spec
        self.version = 0
        self._receiver: WeightReceiver | None = None
        self._links: list[Link | LocalEnvLink] = []

    def _own_sampling(self, seed: int) -> None:
        """The policy samples from this rank's own generator (noise differs per rank), never torch's global one,
        which other ranks share on the in-process backend; `rng_state` saves it."""
        self.generator = torch.Generator().manual_seed(seed + 7919 * (self.rank + 1))
        use_generator(self.policy, self.generator)

    # --- weights ----------------------------------------------------------------------------------
    def weight_layouts(self, adapters: None = None) -> list[TensorLayout]:
        """Every parameter, whole on each rank. (No LoRA here: `adapters` is the reasoning rollout's
        argument, always None for a policy.)"""
        return [replicated(n, tuple(p.shape), self.world_size, str(p.dtype)) for n, p in self.policy.named_parameters()]

    def connect_weights(self, peer_group: str, plan: SyncPlan, transport: str = "group", adapters: None = None) -> None:
        self._receiver = WeightReceiver(self.peer_group(peer_group), plan, self.rank,
                                        dict(self.policy.named_parameters()), transport)

    def apply_weights(self, version: int) -> int:
        if self._receiver is None:
            raise RuntimeError(f"{self.name}: apply_weights before connect_weights")
        received = self._receiver.apply(version)
        self.version = version
        return received

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.policy.state_dict().items()}

    def rng_state(self) -> dict:
        """The sampling RNG (so a resumed run draws the same actions as an uninterrupted one), and the
        state of envs stepped in this process (`attach_envs`), if any."""
        return {"torch": self.generator.get_state(),
                "envs": [{"env": link.env.get_state(), "obs": link.obs} for link in self._local_envs()]}

    def _local_envs(self) -> list[LocalEnvLink]:
        return [link for link in self._links if isinstance(link, LocalEnvLink)]

    def set_rng_state(self, state: dict) -> None:
        self.generator.set_state(state["torch"])
        local = self._local_envs()
        if len(local) != len(state["envs"]):
            raise ValueError(f"{self.name}: the saved state has {len(state['envs'])} attached env sets, "
                             f"this worker {len(local)}")
        for link, saved in zip(local, state["envs"]):
            link.env.set_state(saved["env"])
            link.obs = saved["obs"]

    # --- serving envs -----------------------------------------------------------------------------
    def connect_envs(self, peer_group: str, env_peer_ranks: list[int]) -> None:
        group = self.peer_group(peer_group)
        self._links = [Link(group, r) for r in env_peer_ranks]

    def attach_envs(self, config: EnvConfig, seed: int) -> EnvSpecs:
        """Step `config.num_envs` envs in this process (seeded as env worker `rank` would be); returns
        their specs. `collect` then also returns what an env worker's would (`CollectResult.env`)."""
        link = LocalEnvLink(config, seed + self.rank * config.num_envs, f"envs in {self.name}")
        specs = link.specs()
        if specs.obs_spec != self.obs_spec:
            raise ValueError(f"{self.name}: attached envs give {specs.obs_spec}, the policy takes {self.obs_spec}")
        self._links = [link]
        return specs

    def reset_env_groups(self, seed: int, group_size: int) -> None:
        """`EnvWorker.reset_groups` for the envs stepped in this process."""
        for link in self._local_envs():
            link.obs = link.env.reset_seeds(group_seeds(seed, self.rank * link.n, link.n, group_size))

    @torch.no_grad()
    def _infer(self, obs: dict[str, np.ndarray]):
        return self.policy(_tensors(obs, self.policy.obs_keys))

    @torch.no_grad()
    def collect(self, steps: int, stages: int, envs_per_stage: int, action_shape: tuple[int, ...],
                channel: str | None = None, chunk_steps: int = 0) -> CollectResult:
        """`steps` steps of every (env rank, stage); returns the trajectory with the stats, or puts it on
        `channel` (as chunks of `chunk_steps` steps when > 0) and returns the stats alone."""
        if chunk_steps and channel is None:
            raise ValueError(f"{self.name}: chunk_steps={chunk_steps} streams to a channel; none given")
        if not self._links:
            raise RuntimeError(f"{self.name}: collect before connect_envs or attach_envs")
        msg_layout, act_layout = step_layout(self.obs_spec, envs_per_stage), action_layout((envs_per_stage, *action_shape))
        streams = [_Stream(link) for link in self._links for _ in range(stages)]
        start, busy = time.perf_counter(), 0.0

        def receive(stream: _Stream, first: bool) -> StepMessage:
            nonlocal busy
            msg = stream.link.recv_step(msg_layout, self.obs_spec)
            if not first:
                stream.rewards.append(torch.from_numpy(msg.reward.copy()))
                stream.terminated.append(torch.from_numpy(msg.terminated.copy()))
                stream.truncated.append(torch.from_numpy(msg.truncated.copy()))
                final = torch.zeros(envs_per_stage)
                if msg.truncated.any():  # bootstrap from the truncated episodes' last observations
                    t0 = time.perf_counter()
                    final = self._infer(msg.final_obs)[3]
                    busy += time.perf_counter() - t0
                stream.final_values.append(final)
            return msg

        out = Channel.connect(channel) if channel is not None else None
        sent = 0  # steps already put on the channel
        for t in range(steps):
            for stream in streams:
                msg = receive(stream, first=t == 0)
                t0 = time.perf_counter()
                actions, logprobs, _, values = self._infer(msg.obs)
                env_actions = self.policy.env_actions(actions)
                busy += time.perf_counter() - t0
                stream.link.send(act_layout, {"actions": env_actions})
                for k in self.obs_spec:
                    stream.obs.setdefault(k, []).append(torch.from_numpy(np.array(msg.obs[k])))
                stream.actions.append(actions)
                stream.logprobs.append(logprobs)
                stream.values.append(values)
            if chunk_steps and t - sent == chunk_steps:  # step t inferred (its actions sent, the envs step
                # them meanwhile) and step t-1's rewards in: steps sent..t-1 are whole, step t's values bootstrap them
                out.put(self._trajectory(streams, torch.cat([s.values[t] for s in streams]), sent, t, final=False))
                sent = t
        last_values = []
        for stream in streams:
            msg = receive(stream, first=False)
            last_values.append(self._infer(msg.obs)[3])
            stream.link.flush()
        traj = self._trajectory(streams, torch.cat(last_values), sent, steps, final=True)
        local = self._local_envs()
        result = CollectResult(busy, time.perf_counter() - start, env=local[0].take_stats() if local else None)
        if channel is None:
            result.trajectory = traj
        else:
            out.put(traj)
        return result

    def _trajectory(self, streams: list[_Stream], after: torch.Tensor, lo: int, hi: int, final: bool) -> Trajectory:
        """Steps lo..hi-1 of every stream; `after`: the values of step hi (the bootstrap at the last step)."""
        def cat(get) -> torch.Tensor:  # [hi - lo, n_stream] per stream -> [hi - lo, n]
            return torch.cat([torch.stack(get(s)[lo:hi]) for s in streams], dim=1)

        values, term, trunc = cat(lambda s: s.values), cat(lambda s: s.terminated), cat(lambda s: s.truncated)
        next_values = torch.cat([values[1:], after[None]])
        bootstrap = torch.where(trunc, cat(lambda s: s.final_values), next_values) * ~term
        return Trajectory(obs={k: cat(lambda s, k=k: s.obs[k]) for k in self.obs_spec}, actions=cat(lambda s: s.actions),
                          logprobs=cat(lambda s: s.logprobs), values=values, rewards=cat(lambda s: s.rewards),
                          dones=term | trunc, bootstrap=bootstrap, version=self.version, rank=self.rank, start=lo,
                          final=final)
