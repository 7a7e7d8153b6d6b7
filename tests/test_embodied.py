"""Embodied RL: the env interface on real simulators, GAE over episode segments, the wire format,
the env worker's named errors, and the runner end to end through the hydra example (subprocesses, each
running its workers in process): return goes up on CartPole, resume continues, and pipeline
mode (2 env stages overlapping inference) produces exactly the sequential run's data; env state
save/restore continues bit-exactly on every adapter; a rollout worker stepping its envs in its own
process (`runner.env_in_rollout`) reads the wire's messages."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlinf_like.data.trajectory import StreamedGAE, Trajectory, episode_gae, ppo_batch, rows_batch
from rlinf_like.envs import EnvConfig, make_env
from rlinf_like.envs.render import ensure_gl
from rlinf_like.runtime import WorkerError
from rlinf_like.workers.env import EnvWorker
from rlinf_like.workers.env.link import read_step, step_fields, step_layout
from rlinf_like.workers.env.local import LocalEnvLink
from rlinf_like.workers.env.types import EnvStats, StepMessage

ensure_gl()  # at collection, before any test imports MuJoCo (it picks its GL backend once)
ROOT = Path(__file__).resolve().parents[1]
MAIN = ROOT / "examples" / "embodied" / "main_embodied.py"
# in process (cluster.backend=local): no Ray or worker processes to start; each run still its own Python process,
# so a resumed run restores everything from its checkpoint
CARTPOLE = ["env=cartpole", "runner.steps_per_rollout=64", "env.num_envs=8", "runner.save_every=3",
            "cluster.backend=local"]


def test_gym_vector_env_chunks_autoreset_stats_and_seeding():
    env = make_env(EnvConfig(id="CartPole-v1", num_envs=3), name="env worker test")
    first = env.reset(seed=5)["state"]
    np.testing.assert_array_equal(first, make_env(EnvConfig(id="CartPole-v1", num_envs=3)).reset(seed=5)["state"])
    assert not np.array_equal(first[0], first[1])  # env i is seeded with seed + i
    result = env.step(np.ones((3, 4)))  # a chunk of 4 actions per env: 4 steps, rewards summed
    np.testing.assert_array_equal(result.rewards, [4.0, 4.0, 4.0])
    episodes, steps = [], 0
    while len(episodes) < 3:  # always pushing right ends every episode within a few dozen steps
        result = env.step(np.ones(3))
        episodes += result.episodes
        steps += 1
        assert steps < 200
    assert all(e.ret == e.length and e.success is None for e in episodes)
    assert result.terminated.any() or result.truncated.any() or episodes  # auto-reset kept going
    assert np.abs(env.step(np.zeros(3)).obs["state"]).max() < 1.0  # fresh episodes after the resets


def read_only(tree) -> None:
    if isinstance(tree, np.ndarray):
        tree.setflags(write=False)
    elif isinstance(tree, dict):
        for value in tree.values():
            read_only(value)
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            read_only(value)


@pytest.mark.parametrize("cfg", [EnvConfig(kind="reach_colour", num_envs=2),
                                 EnvConfig(id="CartPole-v1", num_envs=2), EnvConfig(id="Reacher-v5", num_envs=2)],
                         ids=["reach_colour", "cartpole", "reacher"])
def test_env_state_restores_bit_exactly(cfg):
    # mid-episode state -> pickled -> a fresh env reset with another seed: the next 60 steps (with
    # auto-resets, which draw from the restored RNGs) equal the original's bit for bit
    import pickle

    rng = np.random.default_rng(0)
    spec = make_env(cfg).action_spec
    actions = [rng.integers(0, spec.n, 2) if spec.kind == "discrete" else rng.uniform(-1, 1, (2, *spec.shape))
               for _ in range(80)]
    env = make_env(cfg)
    env.reset(1)
    for a in actions[:20]:
        env.step(a)
    saved = pickle.loads(pickle.dumps(env.get_state()))
    read_only(saved)  # as arrays arrive through Ray's object store
    other = make_env(cfg)
    other.reset(99)
    other.set_state(saved)
    episodes = 0
    for a in actions[20:]:
        x, y = env.step(a), other.step(a)
        for k in x.obs:
            np.testing.assert_array_equal(x.obs[k], y.obs[k])
        np.testing.assert_array_equal(x.rewards, y.rewards)
        assert x.episodes == y.episodes
        episodes += len(x.episodes)
    assert episodes >= 1  # the auto-reset path was exercised
    with pytest.raises(ValueError, match="saved env state has 2 envs, this one 3"):
        make_env(cfg, num_envs=3).set_state(saved)


def test_invalid_actions_name_the_env_worker(cluster):
    placement = cluster.place({"env": "0"})
    group = EnvWorker.create_group(EnvConfig(id="Reacher-v5", num_envs=2)).launch(
        cluster, placement, "env", init_process_group=False)
    try:
        ok = group.step(np.zeros((2, 2))).wait()[0]
        assert ok.obs["state"].shape == (2, 10) and ok.rewards.shape == (2,)
        for bad, words in [(np.full((2, 2), np.nan), "NaN"), (np.zeros((2, 3)), "shape (2, 3)"),
                           (np.zeros((3, 2)), "expected (2, 2)")]:
            with pytest.raises(WorkerError, match=r"env worker env\[rank 0\] stage 0: actions") as err:
                group.step(bad).wait()
            assert words in str(err.value)
    finally:
        group.shutdown()


def test_local_env_link_gives_the_wires_messages():
    # runner.env_in_rollout: the rollout's loop reads LocalEnvLink as it reads the wire, so every message
    # must equal what an env worker sends (packed and unpacked), across collects, with the same episodes
    cfg = EnvConfig(id="CartPole-v1", num_envs=4)
    link, env = LocalEnvLink(cfg, seed=3, name="envs in test"), make_env(cfg)
    layout, obs, rng, episodes = step_layout(env.obs_spec, 4), env.reset(3), np.random.default_rng(0), []

    def same(got: StepMessage, sent: StepMessage):
        got, want = step_fields(got), layout.unpack(layout.pack(step_fields(sent)))
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)

    same(link.recv_step(), StepMessage.first(obs, 4))  # a collect starts with the observation alone
    for _ in range(40):
        actions = rng.integers(0, 2, 4).astype(np.float64)
        link.send(None, {"actions": actions})
        result = env.step(actions)
        episodes += result.episodes
        same(link.recv_step(), StepMessage.after(result))
    same(link.recv_step(), StepMessage.first(result.obs, 4))  # the next collect starts where this one ended
    stats = link.take_stats()
    assert len(episodes) > 0 and stats.episodes == episodes and stats.steps == 40 * 4 and stats.busy_s > 0
    assert link.take_stats() == EnvStats()


def test_episode_gae_cuts_at_episode_ends_and_bootstraps():
    # env 0: an episode ends (terminal) after step 1, the next is cut by the rollout end (bootstrap 2);
    # env 1: one episode across the whole rollout, bootstrapped with 3 at the end
    rewards = torch.ones(3, 2)
    values = torch.tensor([[0.5, 0.0], [0.5, 0.0], [0.5, 0.0]])
    dones = torch.tensor([[False, False], [True, False], [False, False]])
    bootstrap = torch.tensor([[9.0, 9.0], [0.0, 9.0], [2.0, 3.0]])  # 9s are never used
    adv, ret = episode_gae(rewards, values, dones, bootstrap, gamma=0.9, lam=1.0)
    torch.testing.assert_close(ret, torch.tensor([[1.9, 4.897], [1.0, 4.33], [2.8, 3.7]]))
    torch.testing.assert_close(adv, ret - values)


def test_streamed_chunks_give_the_whole_trajectorys_batch_bit_for_bit():
    # 37 steps of 5 envs sent as chunks of 10, 10, 10, 7: episodes end inside chunks, on a chunk's last
    # step (9) and first step (20), env 3 never ends, env 4 ends on the final step. The streamed GAE (each
    # episode computed once its chunks are in) and batch equal the whole trajectory's exactly: same per-row ops.
    g = torch.Generator().manual_seed(0)
    steps, n = 37, 5
    dones = torch.zeros(steps, n, dtype=torch.bool)
    for env, ends in {0: [3, 9, 20, 33], 1: [9], 2: [20, 21, 22], 4: [12, 36]}.items():
        dones[ends, env] = True
    whole = Trajectory(obs={"state": torch.randn(steps, n, 4, generator=g)}, actions=torch.randint(0, 2, (steps, n)),
                       logprobs=torch.randn(steps, n, generator=g), values=torch.randn(steps, n, generator=g),
                       rewards=torch.randn(steps, n, generator=g), dones=dones,
                       bootstrap=torch.randn(steps, n, generator=g), version=3, rank=1)
    gae = StreamedGAE(0.99, 0.95)
    finished = []  # per chunk: how many steps x envs had their GAE when it arrived
    for lo in range(0, steps, 10):
        hi = min(lo + 10, steps)
        cut = lambda x: x[lo:hi]  # noqa: E731
        gae.add(Trajectory({"state": cut(whole.obs["state"])}, cut(whole.actions), cut(whole.logprobs),
                           cut(whole.values), cut(whole.rewards), cut(whole.dones), cut(whole.bootstrap),
                           version=3, rank=1, start=lo, final=hi == steps))
        finished.append(int(gae.done_to.sum()))
    assert finished == [10 + 10 + 0 + 0 + 0, 10 + 10 + 0 + 0 + 13, 21 + 10 + 23 + 0 + 13, 5 * 37]  # env 3: at the end
    streamed = rows_batch([gae.result()])
    expected = ppo_batch([whole], 0.99, 0.95)
    assert streamed.keys() == expected.keys()
    for k in expected:
        assert torch.equal(streamed[k], expected[k]), k
    with pytest.raises(ValueError, match="rollout rank 1: a chunk after its final one"):
        gae.add(whole)
    with pytest.raises(ValueError, match="rollout rank 1: chunk starts at step 0, expected 10"):
        first = StreamedGAE(0.99, 0.95)
        first.add(dataclasses.replace(whole, final=False, rewards=whole.rewards[:10], dones=whole.dones[:10]))
        first.add(dataclasses.replace(whole, final=False))


def test_wire_message_round_trip():
    env = make_env(EnvConfig(kind="reach_colour", num_envs=2))
    obs = env.reset(0)
    layout = step_layout(env.obs_spec, 2)
    result = env.step(np.ones((2, 2)))
    back = read_step(layout.unpack(layout.pack(step_fields(StepMessage.after(result)))), env.obs_spec)
    np.testing.assert_array_equal(back.obs["state"], result.obs["state"])
    np.testing.assert_array_equal(back.final_obs["state"], result.final_obs["state"])
    np.testing.assert_array_equal(back.reward, result.rewards)
    assert back.terminated.dtype == bool and not np.array_equal(back.obs["state"], obs["state"])


def launch_main(out: Path, log: Path, *overrides) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HYDRA_FULL_ERROR": "1"}
    with open(log, "w") as f:  # the child keeps its own handle
        return subprocess.Popen([sys.executable, str(MAIN), *overrides, f"runner.output_dir={out}"], stdout=f,
                                stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)


def finish(proc: subprocess.Popen, log: Path, timeout: float = 400) -> str:
    code = proc.wait(timeout)
    text = log.read_text()
    assert code == 0, text[-3000:]
    return text


def history(out: Path) -> list[dict]:
    return json.loads((out / "checkpoint" / "runner.json").read_text())["history"]


@pytest.fixture(scope="module")
def cartpole_runs(tmp_path_factory) -> dict:
    """Four runs of the hydra example, each with its own local Ray (the costly part is starting one,
    not the PPO updates): sequential 6 updates, alongside a pipelined 2-update run; then the first
    resumed for 2 more, alongside an uninterrupted 8-update run streaming its trajectories (chunks of
    24, 24, 16 steps)."""
    root = tmp_path_factory.mktemp("cartpole")
    seq, whole, piped = root / "seq", root / "whole", root / "pipe"
    # 6 updates of 8 envs x 64 steps
    # at most two Ray startups at a time: Ray gives a starting node 30 s, which 3-4 at once on 2 busy
    # cores can exceed
    first = launch_main(seq, root / "seq.log", *CARTPOLE, "runner.total_env_steps=3072")
    pipe = launch_main(piped, root / "pipe.log", *CARTPOLE, "runner.total_env_steps=1024", "runner.pipeline=true")
    procs = [first, pipe]
    try:
        finish(first, root / "seq.log")
        runs = history(seq)
        uninterrupted = launch_main(whole, root / "whole.log", *CARTPOLE, "runner.total_env_steps=4096",
                                    "runner.stream_trajectories=true", "runner.stream_chunk_steps=24")
        procs.append(uninterrupted)
        procs.append(launch_main(seq, root / "resume.log", *CARTPOLE, "runner.total_env_steps=4096", "runner.resume=true"))
        again = finish(procs[-1], root / "resume.log")
        finish(uninterrupted, root / "whole.log")
        finish(pipe, root / "pipe.log")
    finally:  # a failed run must not leave the others running
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return {"seq": seq, "runs": runs, "resumed": history(seq), "resume_log": again, "piped": history(piped),
            "whole": history(whole)}


def test_ppo_on_cartpole_learns(cartpole_runs):
    runs, out = cartpole_runs["runs"], cartpole_runs["seq"]
    assert [h["iteration"] for h in runs] == list(range(1, 7))
    returns = [h["episode_return"] for h in runs]
    # mean return of updates 4-6 over update 1's, measured for seeds 0-4 (a random policy scores ~22): +12.1 (this
    # seed, 24.2 -> 32.7, 38.8, 37.3), +25.2, +24.9, +34.2, +27.3; the margin is half the smallest
    assert np.mean(returns[-3:]) > returns[0] + 6, returns
    assert (out / "curves.png").stat().st_size > 0 and (out / "tensorboard").is_dir()


def deterministic(h: dict) -> dict:
    """A history row without its timings (and the number of trajectory chunks, 3 when streamed)."""
    return {k: v for k, v in h.items() if not k.endswith("_s") and k != "trajectory_chunks"}


def test_resume_continues_the_exact_history(cartpole_runs):
    runs, resumed, whole = cartpole_runs["runs"], cartpole_runs["resumed"], cartpole_runs["whole"]
    assert "resumed at update 6" in cartpole_runs["resume_log"]
    assert resumed[:6] == runs and [h["iteration"] for h in resumed[6:]] == [7, 8]
    assert resumed[-1]["env_steps"] == 8 * 512
    # env state (sims, RNGs, episode counters), sampling RNG and actor state restored: the resumed
    # updates 7-8 equal the uninterrupted run's bit for bit (same episodes, same losses). That run streams
    # its trajectories in 3 chunks per update: streaming changes neither the data nor the losses
    assert [deterministic(h) for h in resumed] == [deterministic(h) for h in whole]
    assert [h["trajectory_chunks"] for h in whole] == [3] * 8 and [h["trajectory_chunks"] for h in resumed] == [1] * 8


def test_pipeline_gives_the_sequential_runs_data(cartpole_runs):
    # 2 stages of 4 envs, same seeds and sampling order: the same episodes and losses as the sequential run
    piped, runs = cartpole_runs["piped"], cartpole_runs["runs"]
    assert [h["iteration"] for h in piped] == [1, 2]
    for a, b in zip(piped, runs[:2]):
        assert a["episode_return"] == pytest.approx(b["episode_return"], rel=1e-6)
        assert a["value_loss"] == pytest.approx(b["value_loss"], rel=1e-4)


def test_bad_config_fails_before_launch(tmp_path):
    # in-process, the same calls main_embodied.py makes before hydra composes / before any worker starts
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    from rlinf_like.config import check_overrides, hydra_schema, structure
    from rlinf_like.runners.embodied.runner import EmbodiedRunner
    from rlinf_like.runners.embodied.config import EmbodiedConfig

    with pytest.raises(Exception, match=r"did you mean 'runner.pipeline'"):
        check_overrides(EmbodiedConfig, ["runner.pipline=true"])
    ConfigStore.instance().store(name="embodied_schema", node=hydra_schema(EmbodiedConfig))
    with initialize_config_dir(str(MAIN.parent / "config"), version_base="1.3"):
        cfg = compose("embodied", ["env=cartpole", "env.num_envs=5", "runner.pipeline=true",
                                   f"runner.output_dir={tmp_path}"])
    with pytest.raises(ValueError, match="env.num_envs=5 must be even"):
        EmbodiedRunner(structure(EmbodiedConfig, cfg))
    cfg.env.num_envs, cfg.runner.env_in_rollout = 4, True
    with pytest.raises(ValueError, match="runner.env_in_rollout=true has none"):
        EmbodiedRunner(structure(EmbodiedConfig, cfg))
    cfg.runner.env_in_rollout, cfg.runner.stream_trajectories, cfg.runner.stream_chunk_steps = False, True, 64
    with pytest.raises(ValueError, match=r"runner.stream_chunk_steps steps: it must be > 0 and < "
                                         r"runner.steps_per_rollout=64 \(else nothing streams\), got 64"):
        EmbodiedRunner(structure(EmbodiedConfig, cfg))


def test_vla_tokens_instruction_attention_and_init_weights(tmp_path):
    # expert labels -> tokens -> env actions is the nearest-bin round trip; the instruction changes
    # where the keypoint heads look; policy.init_weights starts from a saved state dict
    from rlinf_like.models.policies import PolicyConfig, build_policy

    env = make_env(EnvConfig(kind="reach_colour", obs_mode="pixels", image_size=16, num_envs=3))
    obs = {k: torch.from_numpy(v) for k, v in env.reset(0).items()}
    cfg = PolicyConfig(kind="vla", bins=5)
    policy = build_policy(cfg, env.obs_spec, env.action_spec)
    tokens = policy.tokens(np.array([[-1.0, 0.2], [0.6, 1.0], [0.0, -0.4]]))
    assert tokens.tolist() == [[[0, 2]], [[3, 4]], [[2, 1]]]  # bins at -1, -0.5, 0, 0.5, 1
    np.testing.assert_array_equal(policy.env_actions(tokens), [[-1.0, 0.0], [0.5, 1.0], [0.0, -0.5]])
    _, logprobs, _, _ = policy(obs, tokens)
    np.testing.assert_allclose(logprobs.detach().numpy(), 2 * np.log(1 / 5), rtol=1e-6)  # uniform at init
    other = dict(obs, instruction=obs["instruction"].roll(1, 0))  # other colours named
    assert not torch.equal(policy(obs)[3], policy(other)[3])
    torch.save(policy.state_dict(), tmp_path / "w.pt")
    again = build_policy(PolicyConfig(kind="vla", bins=5, init_weights=str(tmp_path / "w.pt")), env.obs_spec,
                         env.action_spec)
    assert all(torch.equal(a, b) for a, b in zip(policy.state_dict().values(), again.state_dict().values()))
    with pytest.raises(ValueError, match=r"policy.init_weights=.* does not load into policy.kind=vla"):
        build_policy(PolicyConfig(kind="vla", bins=7, init_weights=str(tmp_path / "w.pt")), env.obs_spec,
                     env.action_spec)
