"""Embodied RL: env workers <-> rollout (policy inference) -> actor (PPO) -> weight sync, per update.

Per PPO update every env worker and its rollout rank run `steps_per_rollout` steps over their
wire (see workers/env/worker.py); each rollout rank puts its `Trajectory` on a channel, and the
actor, already waiting on that channel, trains as soon as they arrive (GAE, PPO epochs and
mini-batches), then publishes the new weights to the rollout. An actor on several ranks: rank 0
forwards every trajectory to the others, each trains on its own rows (`check_actor_split`).
`runner.pipeline=true` splits each env worker's envs into 2 stages, so the simulator steps one while
the policy infers the other.
`runner.stream_trajectories=true` streams each rank's trajectory in chunks of `runner.stream_chunk_steps`
steps; the actor computes the GAE of every finished episode as they arrive, then trains on the same
batch as without streaming. `runner.env_in_rollout=true` has no env workers: each rollout rank steps its envs in its own process
(`workers/env/local.py`), for simulators cheaper than a per-step handoff between processes.
Checkpoints: actor state (DCP), then the env state (sims, RNGs, episode counters, current obs; in
the env workers, or in the rollout ranks with `env_in_rollout`) with the rollout's sampling RNG,
then the runner state, committed atomically; resume continues exactly where the checkpoint was
taken (the same episodes, actions and losses as an uninterrupted run). A checkpoint without the env
state resumes with fresh episodes.
"""

from __future__ import annotations

import logging
import pickle
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from rlinf_like.algorithms.embodied import check_embodied_algorithm
from rlinf_like.data.episode_groups import check_groups
from rlinf_like.data.trajectory import Trajectory
from rlinf_like.envs import EnvConfig, check_env_config, make_env
from rlinf_like.hybrid_engines.fsdp import FSDPConfig
from rlinf_like.hybrid_engines.model_manager import OptimConfig
from rlinf_like.models.policies import check_policy_fits, policy_class
from rlinf_like.runners.common import connect_env_wire, connect_weight_sync, plot_series, write_worker_pids
from rlinf_like.runners.embodied.config import COMPONENTS, EmbodiedConfig
from rlinf_like.runners.run_record import RunRecord
from rlinf_like.runtime import Channel, Cluster, Device, Placement, plan_placement, wait_all
from rlinf_like.workers.actor.ppo import EmbodiedActorWorker
from rlinf_like.workers.env import EnvWorker, episode_metrics
from rlinf_like.workers.env.types import EnvSpecs
from rlinf_like.workers.rollout.embodied.policy_worker import PolicyRolloutWorker

log = logging.getLogger(__name__)
WORKER_STATE = "workers.pkl"  # env workers' state + rollout RNG, inside each step directory


def env_specs(config: EnvConfig) -> EnvSpecs:
    """The specs an env worker would report, from one env made here (for `runner.env_in_rollout`)."""
    env = make_env(config, 1, "env specs")
    try:
        return EnvSpecs(env.obs_spec, env.action_spec, envs_per_stage=config.num_envs, stages=1)
    finally:
        env.close()


def trajectory_channel(cluster: Cluster) -> Channel[Trajectory]:
    """The rollout -> actor channel, named for this run (another run on the same Ray has its own)."""
    return Channel.create(cluster.scoped_name("trajectories"), Trajectory).ready()


def check_config(cfg: EmbodiedConfig) -> None:
    """Values a schema cannot check, failing before any worker starts and naming the key."""
    check_env_config(cfg.env)
    check_policy_fits(cfg.policy.kind, cfg.env.obs_mode)
    r, a = cfg.runner, cfg.algorithm
    spec = check_embodied_algorithm(a, cfg.policy.kind)
    if not spec.on_policy and (r.gif or r.stream_trajectories):
        raise ValueError(f"algorithm.name={a.name}: runner.gif and runner.stream_trajectories are PPO's (its "
                         "transitions always stream to the replay worker): set them to false")
    if not spec.on_policy and a.sac.buffer_size < 2 * r.steps_per_rollout * cfg.env.num_envs:
        raise ValueError(f"algorithm.sac.buffer_size={a.sac.buffer_size} must hold at least two rounds of "
                         f"transitions (2 x runner.steps_per_rollout x env.num_envs = "
                         f"{2 * r.steps_per_rollout * cfg.env.num_envs})")
    if spec.reads_advantage and a.ppo.advantage != "gae":
        check_groups(cfg)
    for key, value in {"runner.total_env_steps": r.total_env_steps, "runner.steps_per_rollout": r.steps_per_rollout,
                       "env.num_envs": cfg.env.num_envs, "algorithm.ppo.epochs": a.ppo.epochs,
                       "algorithm.ppo.mini_batches": a.ppo.mini_batches, "runner.save_every": r.save_every}.items():
        if value <= 0:
            raise ValueError(f"{key} must be > 0, got {value}")
    if r.pipeline and r.env_in_rollout:
        raise ValueError("runner.pipeline=true overlaps env workers with the rollout; runner.env_in_rollout=true "
                         "has none: set one of them to false")
    if r.pipeline and cfg.env.num_envs % 2:
        raise ValueError(f"runner.pipeline=true splits each env worker's envs in 2 stages: env.num_envs="
                         f"{cfg.env.num_envs} must be even")
    if r.stream_trajectories and not 0 < r.stream_chunk_steps < r.steps_per_rollout:
        raise ValueError(f"runner.stream_trajectories=true sends chunks of runner.stream_chunk_steps steps: it must be "
                         f"> 0 and < runner.steps_per_rollout={r.steps_per_rollout} (else nothing streams), got "
                         f"{r.stream_chunk_steps}")


def check_actor_split(cfg: EmbodiedConfig, actor_ranks: int, env_ranks: int) -> None:
    """Several actor ranks each train on their own rows of every update's batch, one forward per
    mini-batch: each must get the same number of rows per mini-batch (unequal shards would weigh the
    averaged gradient unevenly; an empty one has no loss). `env_ranks`: the ranks that step envs."""
    rows = cfg.runner.steps_per_rollout * cfg.env.num_envs * env_ranks
    minis = cfg.algorithm.ppo.mini_batches
    if actor_ranks > 1 and rows % (actor_ranks * minis):
        who = "rollout" if cfg.runner.env_in_rollout else "env"
        raise ValueError(
            f"runner.steps_per_rollout x env.num_envs x {who} ranks = {cfg.runner.steps_per_rollout} x "
            f"{cfg.env.num_envs} x {env_ranks} = {rows} rows per update do not divide by the actor ranks in "
            f"cluster.component_placement.actor ({actor_ranks}) x algorithm.ppo.mini_batches ({minis}); pick sizes "
            f"whose product is a multiple of {actor_ranks * minis}, or place the actor on one rank")


class EmbodiedRunner(RunRecord):
    """A run object, as the reasoning runner's `ReasoningRun` is: its history, clock, trackers, checkpoints and
    summary.json are a `RunRecord`'s; `_launch` and `_iterate` are its phases, `_loop` the one loop."""

    def __init__(self, cfg: EmbodiedConfig, cluster: Cluster | None = None):
        """`cluster`: a running one to launch on (its Ray stays up; the run ends its own workers and channels);
        None starts one from `cfg.cluster`."""
        check_config(cfg)
        super().__init__(cfg, Path(cfg.runner.output_dir))
        self._borrowed = cluster
        self.iteration, self.env_steps, self.version = 0, 0, 0

    # --- setup ------------------------------------------------------------------------------------
    def plan(self, devices: dict[str, list[Device]]) -> tuple[Placement, list[str]]:
        """The placement on `devices` and the components launched, checked before any worker starts."""
        cfg = self.cfg
        placement = plan_placement(cfg.cluster.component_placement, devices, COMPONENTS)
        needed = [c for c in COMPONENTS if c != "env" or not cfg.runner.env_in_rollout]
        missing = [c for c in needed if c not in placement.components]
        if missing:
            raise ValueError(f"cluster.component_placement places no {missing}; it places {sorted(placement.components)}")
        check_actor_split(cfg, placement["actor"].world_size,
                          placement["rollout" if cfg.runner.env_in_rollout else "env"].world_size)
        return placement, needed

    def _launch(self, cluster: Cluster, seed: int) -> None:
        cfg = self.cfg
        placement, needed = self.plan(cluster.devices)
        cluster.check_in_process(placement, needed)
        log.info("%s", placement.describe())
        self.stages = 2 if cfg.runner.pipeline else 1
        if cfg.runner.env_in_rollout:  # the envs live in the rollout ranks: no env group, no wire
            self.env, specs = None, env_specs(cfg.env)
        else:
            self.env = EnvWorker.create_group(cfg.env, self.stages, seed).launch(cluster, placement, "env",
                                                                                 init_process_group=False)
            specs = self.env.on_ranks(0).specs().wait()[0]
        self.specs = specs
        self.rollout = PolicyRolloutWorker.create_group(cfg.policy, specs.obs_spec, specs.action_spec,
                                                        cfg.runner.seed).launch(cluster, placement, "rollout")
        if self.env is None:
            self.rollout.attach_envs(cfg.env, seed).wait()
        a = cfg.algorithm
        # fp32: a control policy's matmuls are too small for bf16 units to pay for the casts
        fsdp = FSDPConfig(optim=OptimConfig(lr=a.lr, eps=a.adam_eps, clip_grad=a.ppo.max_grad_norm), precision="fp32")
        self.actor = EmbodiedActorWorker.create_group(cfg.policy, specs.obs_spec, specs.action_spec, a.ppo, a.gamma,
                                                      fsdp, cfg.runner.seed).launch(cluster, placement, "actor")
        if self.env is not None:  # env rank e talks to rollout rank e % rollout ranks
            connect_env_wire(self.env, self.rollout)
        connect_weight_sync(self.actor, self.rollout, "weights", *placement.weight_link("actor", "rollout"))
        self.channel = trajectory_channel(cluster)
        action = specs.action_spec
        chunk = (cfg.policy.chunk,) if policy_class(cfg.policy.kind).action_chunks and cfg.policy.chunk > 1 else ()
        self.action_shape = (*chunk, *action.shape)
        self.envs_total = cfg.env.num_envs * (self.rollout if self.env is None else self.env).world_size
        write_worker_pids(self.out, {"env": self.env, "rollout": self.rollout, "actor": self.actor})

    def _sync_weights(self) -> None:
        self.version += 1
        wait_all([self.actor.publish_weights(self.version), self.rollout.apply_weights(self.version)])

    # --- one PPO update ---------------------------------------------------------------------------
    def _iterate(self) -> dict[str, float]:
        r, start = self.cfg.runner, time.perf_counter()
        ppo = self.cfg.algorithm.ppo
        if ppo.advantage != "gae":  # grouped episodes: every group of envs starts this update from one seed
            seed = r.seed + 1_000_003 * (self.iteration + 1)
            (self.rollout.reset_env_groups if self.env is None else self.env.reset_groups)(seed, ppo.group_size).wait()
        train = self.actor.train(channel=self.channel.name, count=self.rollout.world_size,  # waits for data
                                 streamed=r.stream_trajectories)
        rollout = self.rollout.collect(r.steps_per_rollout, self.stages, self.specs.envs_per_stage,
                                       self.action_shape, self.channel.name,
                                       r.stream_chunk_steps if r.stream_trajectories else 0)
        if self.env is None:  # the rollout ranks stepped the envs and report what env workers would
            roll_out = rollout.wait()
            env_out = [o.env for o in roll_out]
        else:
            env_out, roll_out = wait_all([self.env.collect(r.steps_per_rollout, self.action_shape), rollout])
        collect_s = time.perf_counter() - start
        metrics = train.wait()[0]
        train_s = time.perf_counter() - start - collect_s
        self._sync_weights()
        steps = sum(o.steps for o in env_out)
        episodes = [e for o in env_out for e in o.episodes]
        metrics.update(episode_metrics(episodes))
        metrics.update(collect_s=collect_s, train_s=train_s, env_steps_per_s=steps / collect_s,
                       env_busy_s=max(o.busy_s for o in env_out), rollout_busy_s=max(o.busy_s for o in roll_out),
                       rollout_wall_s=max(o.wall_s for o in roll_out))
        self.env_steps += steps
        return metrics

    # --- the loop ---------------------------------------------------------------------------------
    def run(self) -> dict:
        return self._loop("PPO", "ppo")

    def _close(self) -> None:
        self.channel.close()

    def _loop(self, desc: str, prefix: str) -> dict:
        """The loop every embodied algorithm shares: launch or resume, `_iterate` until the env-step budget,
        metrics, checkpoints, the GIF. `desc` labels the progress bar, `prefix` the logged metrics."""
        r = self.cfg.runner
        resume = self.can_resume(r.resume)
        path, state = self.latest() if resume else (None, {})
        workers = self._saved_workers(path) if resume else None
        with (self._borrowed.scope() if self._borrowed else Cluster(self.cfg.cluster)) as cluster:
            # without saved env state, a resumed run's envs start fresh episodes from other seeds
            self._launch(cluster, r.seed + (0 if workers or not resume else 100_003 * state["iteration"]))
            if resume:
                self._restore(path, state, workers)
            else:
                self._sync_weights()
            per_update = r.steps_per_rollout * self.envs_total
            total = -(-r.total_env_steps // per_update)
            self.open_trackers()
            if resume:
                self.track_faults(self.env_steps)
            bar = tqdm(range(self.iteration, total), desc=desc, unit="update", initial=self.iteration, total=total)
            for _ in bar:
                start = time.perf_counter()
                metrics = self._iterate()
                self.iteration += 1
                self.clock += time.perf_counter() - start
                metrics.update(env_steps=self.env_steps, elapsed_s=self.clock)
                self.record("iteration", self.iteration, metrics, prefix, self.env_steps)
                bar.set_postfix(ret=f"{metrics.get('episode_return', float('nan')):.2f}",
                                sps=f"{metrics['env_steps_per_s']:.0f}",
                                **({"success": f"{metrics['success_rate']:.2f}"} if "success_rate" in metrics else {}))
                if self.iteration % r.save_every == 0 or self.iteration == total:
                    self._checkpoint()
            self.close_trackers()
            if r.gif:
                from rlinf_like.runners.embodied.media import write_gif

                write_gif(self.cfg, self.rollout.on_ranks(0).state_dict().wait()[0], self.specs, self.out / "rollout.gif")
            self._close()
        return self._summary()

    # --- checkpoints ------------------------------------------------------------------------------
    def _checkpoint(self) -> None:
        workers = {"env": self.env.get_state().wait() if self.env is not None else [],
                   "rollout_rng": self.rollout.rng_state().wait()}
        self.save(self.iteration, {"actor": self.actor}, self._counters(), {WORKER_STATE: pickle.dumps(workers)})

    def _counters(self) -> dict:
        """The runner state a checkpoint commits beyond the history and the clock."""
        return {"iteration": self.iteration, "env_steps": self.env_steps, "version": self.version}

    @staticmethod
    def _saved_workers(path: Path) -> dict | None:
        file = path / WORKER_STATE
        if not file.exists():
            log.warning("no env state in %s: the envs start fresh episodes", path)
            return None
        return pickle.loads(file.read_bytes())

    def _restore(self, path: Path, state: dict, workers: dict | None) -> None:
        self.load(path, {"actor": self.actor})
        if workers is not None:
            wait_all([self.env.on_ranks(i).set_state(s) for i, s in enumerate(workers["env"])] +  # [] without env workers
                     [self.rollout.on_ranks(i).set_rng_state(s) for i, s in enumerate(workers["rollout_rng"])])
        self.iteration, self.env_steps = state["iteration"], state["env_steps"]
        self.version = state["version"]
        self._sync_weights()  # the rollout starts from the checkpoint's weights
        log.info("resumed at update %d (%d env steps) from %s", self.iteration, self.env_steps, path)

    def _summary(self) -> dict:
        points = lambda key: [(h["env_steps"], h[key]) for h in self.history if key in h]  # noqa: E731
        returns, success = points("episode_return"), points("success_rate")
        plot_series(self.out / "curves.png", [("mean episode return", returns, {"marker": "."})], "env steps",
                    title=f"{self.cfg.env.id if self.cfg.env.kind == 'gym' else self.cfg.env.kind} / {self.cfg.policy.kind}")
        if success:
            plot_series(self.out / "success.png", [("success rate", success, {"marker": "."})], "env steps", (0, 1.05))
        first = [v for _, v in returns[: max(1, len(returns) // 10)]]
        last = [v for _, v in returns[-max(1, len(returns) // 10):]]
        summary = {"updates": self.iteration, "env_steps": self.env_steps, "elapsed_s": self.clock,
                   "return_first": float(np.mean(first)) if first else None,
                   "return_last": float(np.mean(last)) if last else None,
                   "success_last": success[-1][1] if success else None, "output_dir": str(self.out)}
        self.write_summary(summary)
        log.info("plot: %s   TensorBoard: tensorboard --logdir %s", self.out / "curves.png", self.out / "tensorboard")
        return summary
