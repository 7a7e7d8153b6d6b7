"""Adding an advantage estimator is one class plus a registration: a toy estimator registered here runs
through a 2-step run, and the runner's checks read its declarations instead of its name."""


import pytest
import torch

from rlinf_like.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInputs, Advantages
from rlinf_like.algorithms.advantage_estimators import AdvantageEstimator
from rlinf_like.runners.reasoning.config import ReasoningConfig
from rlinf_like.runners.reasoning import check_config, train
from small_runs import in_process, small_reasoning_config

CALLS: list[torch.Tensor] = []


class SignOfReward(AdvantageEstimator):
    """+1 for a response above its group's median reward, -1 below: sequence-level, no critic, no KL in
    reward, no options."""

    def estimate(self, inputs: AdvantageInputs) -> Advantages:
        CALLS.append(inputs.rewards.clone())
        sign = torch.sign(inputs.rewards - inputs.rewards.median(dim=-1, keepdim=True).values)
        return Advantages(advantages=sign.reshape(-1, 1) * inputs.response_mask, metrics={"toy_positive": float((sign > 0).sum())})


@pytest.fixture()
def toy_registered():
    ADVANTAGE_ESTIMATORS.register("toy_sign")(SignOfReward)
    yield
    ADVANTAGE_ESTIMATORS.unregister("toy_sign")


def tiny(tmp_path, advantage="toy_sign") -> ReasoningConfig:
    cfg = small_reasoning_config(tmp_path)
    cfg.algorithm.advantage = advantage
    return cfg


def test_checks_read_the_declarations(toy_registered, tmp_path):
    cfg = tiny(tmp_path)
    check_config(cfg)
    cfg.algorithm.kl_in_reward, cfg.algorithm.kl_beta = True, 0.1  # the toy does not take a KL penalty
    with pytest.raises(ValueError, match=r"algorithm.kl_in_reward needs .* algorithm.advantage in "
                                         r"\['gae', 'reinforce_pp'\]"):
        check_config(cfg)
    cfg = tiny(tmp_path)
    cfg.critic.warmup_steps = 1  # it needs no critic
    with pytest.raises(ValueError, match=r"critic.warmup_steps=1 configures the value model, which only "
                                         r"algorithm.advantage=gae launches \(got toy_sign\)"):
        check_config(cfg)
    cfg = tiny(tmp_path)
    cfg.algorithm.gae.lam = 0.9  # an option only gae reads
    with pytest.raises(ValueError, match=r"algorithm.gae.lam=0.9 is an option of algorithm.advantage=gae; "
                                         r"algorithm.advantage=toy_sign does not read it"):
        check_config(cfg)


@pytest.mark.timeout(300)
def test_a_registered_toy_estimator_runs_two_steps(toy_registered, tmp_path):
    """Registered in this process (the fixture takes it out again), 2 steps in process."""
    CALLS.clear()
    history, calls = train(in_process(tiny(tmp_path))).history, list(CALLS)
    steps = history[1:]
    assert [h["step"] for h in steps] == [1, 2]
    assert len(calls) == 2 and all(c.shape == (4, 4) for c in calls)  # [prompts, samples] each step
    assert [h["toy_positive"] for h in steps] == [float((torch.sign(c - c.median(-1, keepdim=True).values) > 0).sum())
                                                  for c in calls]
    assert (tmp_path / "final_model" / "config.json").exists()


@pytest.mark.parametrize("old, new", [("algorithm.gamma=0.9", "algorithm.gae.gamma"),
                                      ("algorithm.scale_by_std=false", "algorithm.grpo.scale_by_std"),
                                      ("algorithm.critic_warmup_steps=2", "critic.warmup_steps")])
def test_estimator_keys_moved_to_their_sections(old, new):
    from rlinf_like.config.validate import ConfigError, check_overrides

    with pytest.raises(ConfigError, match=rf"{old.split('=')[0]}' has moved: use {new}"):
        check_overrides(ReasoningConfig, [old])
