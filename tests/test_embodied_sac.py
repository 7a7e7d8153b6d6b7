"""Embodied SAC through its workers, and embodied GRPO: `algorithm.name` / `algorithm.ppo.advantage` refused by
key before any worker starts, as are an old (moved) key and a key of the algorithm not chosen; the replay worker
keeps receiving while it serves the learner; the SAC runner over env workers streams, learns, syncs weights every
`runner.sync_every` updates and resumes exactly; grouped episodes share initial states and get group-relative
advantages."""

import logging
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from rlinf_like.algorithms import build_estimator
from rlinf_like.data.episode_groups import episode_group_advantages, group_seeds
from rlinf_like.data.replay import Transitions
from rlinf_like.envs import EnvConfig, make_env
from rlinf_like.runners.embodied.config import EmbodiedAlgorithm, EmbodiedConfig, EmbodiedRunnerConfig
from rlinf_like.runtime import Channel
from rlinf_like.workers.actor.ppo import PPOConfig
from rlinf_like.workers.actor.sac_learner import SACConfig


def sac_config(out, **runner) -> EmbodiedConfig:
    return EmbodiedConfig(
        env=EnvConfig(id="Pendulum-v1", num_envs=2),
        algorithm=EmbodiedAlgorithm(name="sac", lr=1e-3, adam_eps=1e-8,
                                    sac=SACConfig(batch_size=32, learning_starts=32, buffer_size=1000)),
        runner=EmbodiedRunnerConfig(**{"total_env_steps": 128, "steps_per_rollout": 16, "stream_chunk_steps": 8,
                                       "sync_every": 16, "save_every": 2, "output_dir": str(out), **runner}))


def test_bad_algorithm_values_are_refused_before_launch(tmp_path):
    from rlinf_like.algorithms.embodied import runner_class
    from rlinf_like.runners.embodied.runner import EmbodiedRunner

    cfg = sac_config(tmp_path)
    cfg.algorithm.name = "sacc"
    with pytest.raises(ValueError, match=r"algorithm.name='sacc' is not one of \['discrete_sac', 'ppo', 'sac'\]"):
        EmbodiedRunner(cfg)
    cfg.algorithm.name, cfg.policy.kind, cfg.env = "sac", "vla", EnvConfig(kind="reach_colour", obs_mode="pixels")
    with pytest.raises(ValueError, match=r"algorithm.name=sac trains policy.kind in \['mlp'\], not 'vla': .*discrete"):
        runner_class("sac")(cfg)
    cfg = sac_config(tmp_path)
    cfg.algorithm.name, cfg.algorithm.sac, cfg.algorithm.ppo.advantage = "ppo", SACConfig(), "reinforce_pp"
    with pytest.raises(ValueError, match=r"algorithm.ppo.advantage='reinforce_pp' is not one of "
                                         r"\['gae', 'grpo', 'rloo'\]"):
        EmbodiedRunner(cfg)
    cfg.algorithm.ppo.advantage, cfg.algorithm.ppo.group_size, cfg.env.num_envs = "grpo", 3, 4
    with pytest.raises(ValueError, match="env.num_envs per stage \\(4\\) must be a multiple of it"):
        EmbodiedRunner(cfg)
    cfg.algorithm.name, cfg.algorithm.ppo, cfg.algorithm.sac.buffer_size = "sac", PPOConfig(), 40
    with pytest.raises(ValueError, match="algorithm.sac.buffer_size=40 must hold at least two rounds"):
        EmbodiedRunner(cfg)


MAIN = Path(__file__).resolve().parents[1] / "examples/embodied/main_embodied.py"


@pytest.fixture
def no_command_line(monkeypatch):
    """What an earlier test's command line recorded (`config.cli`) stays with it."""
    from rlinf_like.config import cli

    monkeypatch.setattr(cli, "_USER_KEYS", None)
    monkeypatch.setattr(cli, "_SET_KEYS", None)


def command_line(*argv: str) -> EmbodiedConfig:
    """`main_embodied.py ARGV`'s config: its command line checked and prepared, then composed by hydra."""
    from hydra.core.config_store import ConfigStore

    from rlinf_like.config import hydra_schema
    from rlinf_like.config.cli import composed, prepare_command_line

    ConfigStore.instance().store(name="embodied_schema", node=hydra_schema(EmbodiedConfig))
    return composed(EmbodiedConfig, MAIN.parent / "config", "embodied",
                    prepare_command_line(EmbodiedConfig, list(argv), MAIN, "embodied"))


@pytest.mark.parametrize("old, new", [("algorithm.lam=0.9", "algorithm.ppo.lam"),
                                      ("algorithm.max_grad_norm=1.0", "algorithm.ppo.max_grad_norm"),
                                      ("algorithm.grpo.scale_by_std=false", "algorithm.ppo.grpo.scale_by_std"),
                                      ("algorithm.tau=0.01", "algorithm.sac.tau"),
                                      ("algorithm.buffer_size=5000", "algorithm.sac.buffer_size")])
def test_an_old_algorithm_key_is_refused_with_its_new_name(old, new, no_command_line):
    from rlinf_like.config import ConfigError, structure

    key, value = old.split("=")
    message = rf"config key '{re.escape(key)}' has moved: use {re.escape(new)}$"
    with pytest.raises(SystemExit, match=message):  # main_embodied.py's override check, before hydra
        command_line("env=cartpole", old)
    nested = {}
    for part in reversed(key.split(".")):
        nested = {part: nested or value}
    with pytest.raises(ConfigError, match=message):  # a preset or a mapping naming it
        structure(EmbodiedConfig, nested)


def test_a_key_of_the_algorithm_not_chosen_is_refused_naming_who_reads_it(tmp_path, no_command_line, caplog):
    from rlinf_like.runners.embodied.runner import EmbodiedRunner

    out = f"runner.output_dir={tmp_path}"
    cfg = EmbodiedConfig(algorithm=EmbodiedAlgorithm(sac=SACConfig(tau=0.01)),
                         runner=EmbodiedRunnerConfig(output_dir=str(tmp_path)))
    with pytest.raises(ValueError, match=r"algorithm.sac.tau=0.01 is read by algorithm.name in \['discrete_sac', "
                                         r"'sac'\]; algorithm.name=ppo reads algorithm.ppo: leave it at its default "
                                         r"0.005"):
        EmbodiedRunner(cfg)
    cfg = sac_config(tmp_path)
    cfg.algorithm.ppo.grpo.scale_by_std = False
    with pytest.raises(ValueError, match=r"algorithm.ppo.grpo.scale_by_std=False is read by algorithm.name in "
                                         r"\['ppo'\]; algorithm.name=sac reads algorithm.sac"):
        EmbodiedRunner(cfg)
    with pytest.raises(ValueError, match=r"algorithm.sac.tau=0.01 is read by algorithm.name in"):
        EmbodiedRunner(command_line("env=cartpole", "algorithm.sac.tau=0.01", out))
    with pytest.raises(ValueError, match=r"algorithm.ppo.advantage='grpo' is read by algorithm.name in \['ppo'\]"):
        EmbodiedRunner(command_line("env=pendulum", "algorithm.ppo.advantage=grpo", out))
    # an env preset's tuning of another algorithm is the preset's, not the user's: dropped, in one log line
    cfg = command_line("env=reacher", "algorithm.name=sac", out)
    assert cfg.algorithm.ppo.mini_batches == 32
    with caplog.at_level(logging.INFO, logger="rlinf_like.algorithms.embodied"):
        EmbodiedRunner(cfg)
    assert cfg.algorithm.ppo == PPOConfig() and cfg.algorithm.gamma == 0.99
    assert "algorithm.name=sac: dropped the preset's algorithm.ppo.vf_coef=1.0, algorithm.ppo.mini_batches=32" \
        in caplog.text
    cfg = command_line("env=pendulum", "algorithm.name=ppo", out)
    EmbodiedRunner(cfg)
    assert cfg.algorithm.sac == SACConfig() and cfg.algorithm.lr == 1e-3  # the shared keys stay as the preset set


def chunk(round: int, rank: int = 0, steps: int = 4) -> Transitions:
    obs = np.full((steps, 2, 3), round, np.float32)
    zeros = np.zeros((steps, 2), bool)
    return Transitions(obs, np.zeros((steps, 2, 1), np.float32), np.ones((steps, 2), np.float32), obs, zeros, zeros,
                       rank, round)


def test_replay_worker_keeps_receiving_while_the_learner_samples(cluster):
    from rlinf_like.workers.replay import ReplayWorker, Samples

    placement = cluster.place({"replay": "0"})
    replay = ReplayWorker.create_group(SACConfig(buffer_size=1000, batch_size=4, n_step=1), (3,), (1,), 0.99,
                                       0).launch(cluster, placement, "replay", init_process_group=False)
    feed = Channel.create(cluster.scoped_name("test-transitions"), Transitions)
    samples = Channel.create(cluster.scoped_name("test-samples"), Samples, maxsize=1)  # serve blocks on a slow learner
    replay.start_receiving(feed.name).wait()
    feed.put(chunk(0))
    assert replay.on_ranks(0).seal(0, 1).wait() == [8]
    serve = replay.on_ranks(0).serve(40, samples.name, per_item=4)  # 10 items through a 1-slot channel
    stop, producer_puts = threading.Event(), []

    def produce():  # the rollout streams round 1 while the learner samples round 0's data
        while not stop.is_set():
            feed.put(chunk(1))
            producer_puts.append(time.time())
            time.sleep(0.05)

    thread = threading.Thread(target=produce)
    thread.start()
    learner_start = time.time()
    got = [samples.get() for _ in range(10) if not time.sleep(0.1)]
    learner_end = time.time()
    stop.set()
    thread.join()
    serve.wait()
    stats = replay.on_ranks(0).stats().wait()[0]
    during = [t for t in stats["received_at"] if learner_start < t < learner_end]
    assert len(during) >= 5, (len(during), stats["received"])  # received throughout, not after serving
    assert all(float(b["obs"].max()) == 0 for s in got for b in s.batches)  # only the sealed round is sampled
    assert replay.on_ranks(0).seal(1, stats["staged"]).wait() == [8 + 8 * stats["staged"]]
    replay.shutdown() if hasattr(replay, "shutdown") else None
    feed.close()


def history(h: list[dict]) -> list[dict]:
    timing = ("collect_s", "train_s", "env_steps_per_s", "elapsed_s")
    return [{k: v for k, v in row.items() if k not in timing} for row in h]


def in_process(cfg: EmbodiedConfig) -> EmbodiedConfig:
    """`cfg` on the in-process backend (its placement has one rank per group): no Ray or worker processes."""
    cfg.cluster.backend = "local"
    return cfg


def test_sac_runner_streams_learns_syncs_and_resumes_exactly(tmp_path):
    sac_runner_body(tmp_path)  # in process: the rollout and the learner each sample from their own generator


def test_grpo_runner_trains_on_grouped_episodes(tmp_path):
    grpo_runner_body(tmp_path)  # in process: only the rollout draws from torch's generator


def sac_runner_body(tmp_path):
    from rlinf_like.runners.embodied.sac import EmbodiedSACRunner

    whole = EmbodiedSACRunner(in_process(sac_config(tmp_path / "whole")))
    whole.run()
    first = EmbodiedSACRunner(in_process(sac_config(tmp_path / "cut", total_env_steps=64)))
    first.run()
    resumed = EmbodiedSACRunner(in_process(sac_config(tmp_path / "cut", resume=True)))
    resumed.run()
    rows = history(whole.history)
    assert [r["updates"] for r in rows] == [0, 32, 32, 32]  # round 0 random, then utd=1 x 32 env steps each
    assert [r["replay_size"] for r in rows] == [32, 64, 96, 128] and rows[-1]["env_steps"] == 128
    assert [r["weight_version"] for r in rows] == [1, 2, 3, 4]  # sync_every=16 <= 32 updates a round: every round
    assert np.isfinite(rows[-1]["q_loss"]) and rows[-1]["alpha"] < 1.0  # the temperature is being tuned
    assert history(resumed.history) == rows  # learner, replay, envs, rollout RNG and weights restored


def test_grouped_envs_share_initial_states():
    env = make_env(EnvConfig(id="CartPole-v1", num_envs=6), name="grouped")
    obs = env.reset_seeds(group_seeds(100, 0, 6, 3))["state"]
    assert np.array_equal(obs[0], obs[1]) and np.array_equal(obs[1], obs[2]) and np.array_equal(obs[3], obs[5])
    assert not np.array_equal(obs[0], obs[3])
    assert group_seeds(7, 4, 4, 4) == [8, 8, 8, 8] and group_seeds(7, 2, 4, 2) == [8, 8, 9, 9]


def test_grouped_advantages_are_relative_to_the_group_and_mask_after_the_first_episode():
    # 4 envs in 2 groups, T=3; env 0 ends at step 1 (return 1+2), env 1 at step 0 (return 5), env 2 and 3 at step 2
    rewards = torch.tensor([[1.0, 5.0, 1.0, 1.0], [2.0, 9.0, 1.0, 2.0], [7.0, 9.0, 1.0, 3.0]])
    dones = torch.tensor([[False, True, False, False], [True, False, False, False], [False, False, True, True]])
    grpo = build_estimator("grpo", PPOConfig(advantage="grpo"))
    adv, ret, mask = episode_group_advantages(rewards, dones, 2, grpo)
    assert ret.tolist() == [3.0, 5.0, 3.0, 6.0]
    assert mask.T.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]]
    s = float(torch.tensor([3.0, 5.0]).std())
    expect = torch.tensor([-1 / s, 1 / s, -1.5 / float(torch.tensor([3.0, 6.0]).std()),
                           1.5 / float(torch.tensor([3.0, 6.0]).std())])
    assert torch.allclose(adv[0], expect, atol=1e-4) and adv[2, 0] == 0 and adv[1, 1] == 0
    rloo = build_estimator("rloo", PPOConfig(advantage="rloo"))
    assert torch.allclose(episode_group_advantages(rewards, dones, 2, rloo)[0][0], torch.tensor([-2.0, 2.0, -3.0, 3.0]))
    with pytest.raises(ValueError, match="did not finish an episode in runner.steps_per_rollout=1"):
        episode_group_advantages(rewards[:1], dones[:1], 2, grpo)


def grpo_runner_body(tmp_path):
    from rlinf_like.runners.embodied.runner import EmbodiedRunner

    cfg = EmbodiedConfig(env=EnvConfig(id="CartPole-v1", num_envs=4, max_episode_steps=40),
                         algorithm=EmbodiedAlgorithm(ppo=PPOConfig(advantage="grpo", group_size=2, epochs=1,
                                                                   mini_batches=2)),
                         runner=EmbodiedRunnerConfig(total_env_steps=320, steps_per_rollout=40, env_in_rollout=True,
                                                     output_dir=str(tmp_path)))
    runner = EmbodiedRunner(in_process(cfg))
    runner.run()
    assert len(runner.history) == 2 and all(np.isfinite(h["group_return_mean"]) for h in runner.history)
    assert all(h["explained_variance"] == 1.0 for h in runner.history)  # no critic target under grpo
