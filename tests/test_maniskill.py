"""ManiSkill3 adapter (`env.kind=maniskill`) on the real simulator: reset / step / auto-reset / seeding, episode
stats, named errors, exact resume by episode replay, pixel observations, and the batched (GPU-sim) stepping code
against the per-env one. Skips, naming the install step, without mani-skill or a Vulkan driver SAPIEN can use."""

from __future__ import annotations

import numpy as np
import pytest

from rlinf_like.envs.config import EnvConfig
from rlinf_like.envs.factory import check_env_config, make_env
from rlinf_like.envs.vulkan import INSTALL_HINT

pytest.importorskip("mani_skill", reason=f"mani-skill is not installed: {INSTALL_HINT}")

from rlinf_like.envs.maniskill import ManiSkillEnv  # noqa: E402
from rlinf_like.envs.maniskill_gpu import ManiSkillGPUEnv  # noqa: E402


def build(cls=ManiSkillEnv, **kwargs):
    try:
        return cls("PickCube-v1", name="env[0]", **kwargs)
    except RuntimeError as err:
        if "Vulkan" in str(err):
            pytest.skip(str(err))
        raise


@pytest.fixture(scope="module")
def env():
    env = build(num_envs=2, sim_backend="physx_cpu")
    yield env
    env.close()


def actions(seed: int, steps: int, n: int = 2) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(steps, n, 8))


def test_seeding_reset_step_and_auto_reset(env):
    assert env.obs_spec["state"].shape == (42,) and env.action_spec.shape == (8,)
    first = env.reset(seed=3)["state"]
    assert np.array_equal(env.reset(seed=3)["state"], first)  # same seed, same start, whatever ran before
    assert not np.array_equal(env.reset(seed=4)["state"], first)
    group = env.reset_seeds([7, 7])["state"]  # a GRPO group: one seed, one initial state in every slot
    assert np.array_equal(group[0], group[1]) and np.array_equal(env.reset_seeds([3, 9])["state"][0], first[0])
    env.reset(seed=3)
    episodes, ends = [], []
    for t, a in enumerate(actions(0, 60)):
        result = env.step(a)
        episodes += result.episodes
        if result.terminated.any() or result.truncated.any():
            ends.append(t)
            done = result.terminated | result.truncated
            # auto-reset: obs is the next episode's first, final_obs the ended one's last
            assert not np.array_equal(result.obs["state"][done], result.final_obs["state"][done])
    # random arm motions never lift the cube: every episode runs to PickCube's 50-step limit, truncated
    assert ends == [49] and len(episodes) == 2
    assert all(e.length == 50 and e.success == 0.0 and e.ret > 0 for e in episodes)  # dense reward > 0


def test_auto_reset_draws_follow_the_reset_seed(env):
    def run():
        env.reset(seed=11)
        return np.stack([env.step(a).obs["state"] for a in actions(1, 55)])

    a, b = run(), run()
    assert np.array_equal(a, b)  # the episodes after the auto-reset too (step 50 on)


def test_bad_actions_are_named(env):
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"env\[0\]: actions have shape \(3, 8\)"):
        env.step(np.zeros((3, 8)))
    with pytest.raises(ValueError, match=r"env\[0\]: actions contain NaN or inf \(envs \[1\]\)"):
        env.step(np.stack([np.zeros(8), np.full(8, np.nan)]))
    with pytest.raises(ValueError, match="env.kwargs \\['camera'\\] are not ManiSkill options"):
        make_env(EnvConfig(kind="maniskill", id="PickCube-v1", num_envs=1, kwargs={"camera": 1}))
    with pytest.raises(ValueError, match=r"env.obs_mode='rgb' is not one of \['state', 'pixels'\]"):
        check_env_config(EnvConfig(kind="maniskill", id="PickCube-v1", obs_mode="rgb"))


def test_resume_is_exact_across_an_auto_reset(env):
    env.reset(seed=5)
    for a in actions(2, 30):
        env.step(a)
    saved = env.get_state()  # mid-episode: 30 actions to replay per env
    later = actions(3, 40)  # crosses the auto-reset at step 50
    reference = [env.step(a) for a in later]
    env.reset(seed=99)  # elsewhere entirely
    env.set_state(saved)
    for a, ref in zip(later, reference):
        got = env.step(a)
        assert np.array_equal(got.obs["state"], ref.obs["state"]) and np.array_equal(got.rewards, ref.rewards)
        assert got.episodes == ref.episodes


def test_batched_stepping_equals_the_per_env_adapter(env):
    """ManiSkillGPUEnv's code (one batched scene, partial seeded resets, chunked steps) on the CPU sim with one
    env: the same episodes as the per-env adapter; on a GPU the same class runs physx_cuda."""
    batched = build(ManiSkillGPUEnv, num_envs=1, sim_backend="physx_cpu", render_backend="cpu")
    single = build(num_envs=1, sim_backend="physx_cpu")
    chunks = np.random.default_rng(4).uniform(-1, 1, size=(20, 1, 3, 8))  # 60 steps in chunks of 3
    assert np.array_equal(batched.reset(seed=8)["state"], single.reset(seed=8)["state"])
    for chunk in chunks:
        a, b = batched.step(chunk), single.step(chunk)
        assert np.array_equal(a.obs["state"], b.obs["state"]) and np.array_equal(a.rewards, b.rewards)
        assert a.episodes == b.episodes and np.array_equal(a.truncated, b.truncated)
    saved = batched.get_state()
    batched.set_state(saved)  # scene state dict + controller + counters go back in
    batched.close()
    single.close()


def test_pixel_observations():
    env = build(num_envs=1, obs_mode="pixels", image_size=32, sim_backend="physx_cpu")
    assert env.obs_spec["image"].shape == (32, 32, 3) and env.obs_spec["image"].dtype == "uint8"
    assert env.obs_spec["instruction"].dtype == "int64" and env.obs_spec["state"].shape[0] > 18  # qpos+qvel+extras
    first = env.reset(seed=1)
    assert first["image"].std() > 10  # a rendered scene, not a blank frame
    moved = env.step(np.ones((1, 8)))
    assert not np.array_equal(moved.obs["image"], first["image"])
    env.close()


@pytest.mark.gpu
def test_gpu_sim_batched_envs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    env = make_env(EnvConfig(kind="maniskill", id="PickCube-v1", num_envs=4))
    assert isinstance(env, ManiSkillGPUEnv)
    obs = env.reset_seeds([7, 7, 8, 8])["state"]
    assert np.array_equal(obs[0], obs[1]) and not np.array_equal(obs[1], obs[2])
    episodes = [e for a in actions(5, 50, n=4) for e in env.step(a).episodes]
    assert len(episodes) == 4 and all(e.length == 50 for e in episodes)
    env.close()
