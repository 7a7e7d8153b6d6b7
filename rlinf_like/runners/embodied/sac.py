"""Embodied SAC: env workers <-> SAC rollout -> replay worker -> SAC actor -> weight sync.

A round: every rollout rank steps its envs `runner.steps_per_rollout` steps (over the wire to env workers, or
its own envs with `runner.env_in_rollout`) and streams each `runner.stream_chunk_steps` steps of transitions to
the replay worker's channel as it goes; meanwhile the replay worker serves the learner `algorithm.sac.utd` x (the
round's env steps) batches, sampled from what the previous rounds stored, and the learner trains on them.
So collection, receiving and learning overlap. At the round's end the replay worker seals the round's chunks
into its buffer (rank order: deterministic), and once `runner.sync_every` updates have accumulated the actor's
weights go to the rollout through the weight sync. Until `algorithm.sac.learning_starts` env steps the rollout
acts uniformly at random and nothing trains.

Checkpoints (every `runner.save_every` rounds): the learner (networks, targets, optimizers, temperature,
RNG), the replay buffer and its RNG (`runner.save_replay`; without it a resumed run starts from an empty
buffer, logged), env state, rollout RNG and the weights it acts with, then the runner state. Resume is exact.

`EmbodiedDiscreteSACRunner` (algorithm.name=discrete_sac) is the same loop with other networks (`_networks`):
a registered policy acting in tokens (the MLP on discrete actions, the pixel VLA) and its twin token critics.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from rlinf_like.algorithms.embodied import check_action_kind
from rlinf_like.models.discrete_sac import TokenPolicy
from rlinf_like.models.policies import policy_class
from rlinf_like.models.sac import SACRolloutPolicy
from rlinf_like.runners.common import connect_env_wire, connect_weight_sync, write_worker_pids
from rlinf_like.runners.embodied.runner import WORKER_STATE, EmbodiedRunner, env_specs
from rlinf_like.runners.run_record import CHECKPOINT
from rlinf_like.runtime import Channel, Cluster, Device, Placement, plan_placement, wait_all
from rlinf_like.workers.actor.sac import SACActorWorker
from rlinf_like.workers.actor.discrete_sac_learner import DiscreteSACLearner
from rlinf_like.workers.actor.sac_learner import SACConfig, SACLearner
from rlinf_like.workers.env import EnvWorker, episode_metrics
from rlinf_like.workers.env.types import EnvSpecs
from rlinf_like.workers.replay import ReplayWorker, Samples
from rlinf_like.workers.rollout.embodied.sac_rollout import SACRolloutWorker

log = logging.getLogger(__name__)
COMPONENTS = ("actor", "rollout", "env", "replay")
__all__ = ["CHECKPOINT", "EmbodiedDiscreteSACRunner", "EmbodiedSACRunner"]


class EmbodiedSACRunner(EmbodiedRunner):
    def _networks(self, specs: EnvSpecs, sac: SACConfig) -> tuple[Callable, Callable, tuple[str, ...]]:
        """(the rollout's actor, the learner, the observation fields they read) for the env's specs."""
        cfg, a = self.cfg, self.cfg.algorithm
        if set(specs.obs_spec) != {"state"}:
            raise ValueError(f"algorithm.name=sac takes state observations; env {cfg.env.id} gives "
                             f"{sorted(specs.obs_spec)}")
        obs_dim, hidden = int(np.prod(specs.obs_spec["state"].shape)), list(cfg.policy.hidden)
        return (partial(SACRolloutPolicy, obs_dim, specs.action_spec, hidden),
                partial(SACLearner, obs_dim, specs.action_spec, hidden, sac, a.gamma, a.lr, a.adam_eps), ("state",))

    def plan(self, devices: dict[str, list[Device]]) -> tuple[Placement, list[str]]:
        """The placement on `devices` and the components launched, checked before any worker starts."""
        spec = dict(self.cfg.cluster.component_placement)
        spec.setdefault("replay", spec["actor"])  # unplaced: beside the learner it feeds
        placement = plan_placement(spec, devices, COMPONENTS)
        return placement, [c for c in COMPONENTS if c != "env" or not self.cfg.runner.env_in_rollout]

    def _launch(self, cluster: Cluster, seed: int) -> None:
        cfg, r = self.cfg, self.cfg.runner
        placement, needed = self.plan(cluster.devices)
        cluster.check_in_process(placement, needed)
        self.stages = 2 if r.pipeline else 1
        if r.env_in_rollout:
            self.env, specs = None, env_specs(cfg.env)
        else:
            self.env = EnvWorker.create_group(cfg.env, self.stages, seed).launch(cluster, placement, "env",
                                                                                 init_process_group=False)
            specs = self.env.on_ranks(0).specs().wait()[0]
        action, a = specs.action_spec, cfg.algorithm
        check_action_kind(a.name, cfg.policy.kind, action)
        self.specs = specs
        actor_net, learner, keys = self._networks(specs, a.sac)
        self.rollout = SACRolloutWorker.create_group(specs.obs_spec, action.shape, actor_net, r.seed).launch(
            cluster, placement, "rollout")
        if self.env is None:
            self.rollout.attach_envs(cfg.env, seed).wait()
        self.actor = SACActorWorker.create_group(learner, r.seed).launch(cluster, placement, "actor")
        act_shape = actor_net().action_shape  # a replay row's action (the actor's, not the env's)
        self.replay = ReplayWorker.create_group(a.sac, {k: specs.obs_spec[k] for k in keys}, act_shape, a.gamma,
                                                r.seed).launch(cluster, placement, "replay", init_process_group=False)
        if self.env is not None:  # env rank e talks to rollout rank e % rollout ranks
            connect_env_wire(self.env, self.rollout)
        connect_weight_sync(self.actor, self.rollout, "weights", *placement.weight_link("actor", "rollout"))
        from rlinf_like.data.replay import Transitions

        self.channel = Channel.create(cluster.scoped_name("transitions"), Transitions)
        self.samples = Channel.create(cluster.scoped_name("samples"), Samples)
        self.replay.start_receiving(self.channel.name).wait()
        self.envs_total = cfg.env.num_envs * (self.rollout if self.env is None else self.env).world_size
        self.owed, self.unsynced, self.stored = 0.0, 0, 0
        write_worker_pids(self.out, {"env": self.env, "rollout": self.rollout, "actor": self.actor,
                                     "replay": self.replay})

    # --- one round ---------------------------------------------------------------------------------
    def _iterate(self) -> dict[str, float]:
        r, sac, start = self.cfg.runner, self.cfg.algorithm.sac, time.perf_counter()
        steps = r.steps_per_rollout * self.envs_total
        random = self.env_steps < sac.learning_starts
        collect = self.rollout.collect_transitions(r.steps_per_rollout, self.stages, self.specs.envs_per_stage,
                                                   self.channel.name, self.iteration, random, r.stream_chunk_steps)
        env_call = self.env.collect(r.steps_per_rollout, self.specs.action_spec.shape) if self.env else None
        count = 0
        if self.stored >= max(sac.learning_starts, 1):  # learn from the rounds already stored
            self.owed += sac.utd * steps
            count, self.owed = int(self.owed), self.owed - int(self.owed)
        train = [self.replay.serve(count, self.samples.name),
                 self.actor.train(self.samples.name, count)] if count else []
        roll_out = collect.wait()
        env_out = [o.env for o, _ in roll_out] if self.env is None else env_call.wait()
        collect_s = time.perf_counter() - start
        metrics = wait_all(train)[1][0] if train else {}
        train_s = time.perf_counter() - start - collect_s
        self.stored = self.replay.on_ranks(0).seal(self.iteration, sum(n for _, n in roll_out)).wait()[0]
        self.unsynced += count
        if self.unsynced >= r.sync_every:
            self._sync_weights()
            self.unsynced = 0
        self.env_steps += steps
        metrics.update(episode_metrics([e for o in env_out for e in o.episodes]))
        metrics.update(collect_s=collect_s, train_s=train_s, env_steps_per_s=steps / collect_s, updates=count,
                       replay_size=self.stored, weight_version=self.version)
        return metrics

    # --- checkpoints -------------------------------------------------------------------------------
    def _checkpoint(self) -> None:
        workers = {"env": self.env.get_state().wait() if self.env is not None else [],
                   "rollout_rng": self.rollout.rng_state().wait(),
                   "rollout_policy": self.rollout.on_ranks(0).state_dict().wait()[0],
                   "replay": self.replay.on_ranks(0).state().wait()[0] if self.cfg.runner.save_replay else None}
        self.save(self.iteration, {"sac_actor.pt": self.actor},
                  {**self._counters(), "owed": self.owed, "unsynced": self.unsynced, "stored": self.stored},
                  {WORKER_STATE: pickle.dumps(workers)})

    def _restore(self, path, state: dict, workers: dict | None) -> None:
        self.load(path, {"sac_actor.pt": self.actor})
        self.iteration, self.env_steps = state["iteration"], state["env_steps"]
        self.version = state["version"] - 1
        self.owed, self.unsynced = state["owed"], state["unsynced"]
        self._sync_weights()  # the sync's first round (as the saved version); then the weights the rollout acted with
        if workers is None:
            return
        wait_all([self.env.on_ranks(i).set_state(s) for i, s in enumerate(workers["env"])] +
                 [self.rollout.on_ranks(i).set_rng_state(s) for i, s in enumerate(workers["rollout_rng"])] +
                 [self.rollout.load_policy(workers["rollout_policy"])])
        if workers["replay"] is None:
            log.warning("runner.save_replay=false: the replay buffer was not checkpointed; the resumed run "
                        "starts from an empty one (no updates until algorithm.sac.learning_starts stored steps)")
            self.stored = 0
        else:
            self.replay.on_ranks(0).load_state(workers["replay"]).wait()
            self.stored = state["stored"]

    def run(self) -> dict:
        return self._loop("SAC", "sac")

    def _close(self) -> None:
        self.channel.close()
        self.samples.close()


class EmbodiedDiscreteSACRunner(EmbodiedSACRunner):
    def _networks(self, specs: EnvSpecs, sac: SACConfig) -> tuple[Callable, Callable, tuple[str, ...]]:
        cfg, a = self.cfg, self.cfg.algorithm
        policy = policy_class(cfg.policy.kind)
        if policy.action_chunks and cfg.policy.chunk > 1:
            raise ValueError(f"algorithm.name=discrete_sac stores one transition per env step: policy.chunk="
                             f"{cfg.policy.chunk} must be 1")
        return (partial(TokenPolicy, cfg.policy, specs.obs_spec, specs.action_spec),
                partial(DiscreteSACLearner, cfg.policy, specs.obs_spec, specs.action_spec, sac, a.gamma, a.lr,
                        a.adam_eps), policy.obs_keys)
