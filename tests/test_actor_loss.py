"""The actor's RL loss on a real (tiny) HF model, and the runner's advantage shaping, by hand."""

import math

import pytest
import torch

from rlinf_like.algorithms import KL_ESTIMATORS
from rlinf_like.data.batch import build_rl_batch
from rlinf_like.hybrid_engines.model_manager import token_logprobs
from rlinf_like.models.tiny import build_tiny_model
from rlinf_like.runners.reasoning.config import ReasoningConfig, RunnerConfig
from rlinf_like.algorithms import build_estimator
from rlinf_like.runners.reasoning.phases import advantages
from rlinf_like.runners.reasoning import check_config
from rlinf_like.workers.actor.loss import LossConfig, LossTerms, rl_loss


@pytest.fixture(scope="module")
def model_and_batch():
    model, _ = build_tiny_model()
    prompts, responses = [[5, 6, 7], [8, 9]], [[10, 11], [12, 13, 14]]
    batch = build_rl_batch(prompts, responses, [[0.0] * 2, [0.0] * 3], [1.0, -0.5])
    with torch.no_grad():
        own = token_logprobs(model, batch)
    batch["old_logprobs"] = own * batch["response_mask"]  # on-policy: ratio 1 on every response token
    return model, batch


def test_batch_alignment():
    batch = build_rl_batch([[5, 6, 7]], [[10, 11]], [[-0.1, -0.2]], [2.0])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 10, 11]]
    # position t predicts token t+1: the response tokens 10, 11 are predicted at positions 2 and 3
    assert batch["response_mask"].tolist() == [[0, 0, 1, 1]]
    assert batch["old_logprobs"].tolist() == [[0, 0, pytest.approx(-0.1), pytest.approx(-0.2)]]
    assert batch["advantages"].tolist() == [[0, 0, 2, 2]]


def test_on_policy_loss_is_minus_the_mean_advantage_plus_kl(model_and_batch):
    model, batch = model_and_batch
    loss, metrics = rl_loss(LossConfig())(model, batch)
    # 2 tokens with A = 1, 3 tokens with A = -0.5: token-mean of -A * 1 = -(2 - 1.5) / 5
    assert loss.item() == pytest.approx(-0.1, abs=1e-6) and metrics["clip_fraction"] == 0.0
    batch = {**batch, "ref_logprobs": batch["old_logprobs"] - 0.1 * batch["response_mask"]}
    with_kl, metrics = rl_loss(LossConfig(), LossTerms(kl_beta=0.5))(model, batch)
    k3 = math.exp(-0.1) + 0.1 - 1  # exp(ref - pi) - (ref - pi) - 1 with ref - pi = -0.1
    assert metrics["kl"] == pytest.approx(k3, rel=1e-4)
    assert with_kl.item() == pytest.approx(-0.1 + 0.5 * k3, abs=1e-6)
    assert metrics["entropy"] > 0


def test_advantage_shaping_in_the_runner(tmp_path):
    cfg = ReasoningConfig(runner=RunnerConfig(output_dir=str(tmp_path)))
    check_config(cfg)

    def shape(rewards, batch):
        extra = advantages(build_estimator(cfg.algorithm.advantage, cfg.algorithm), cfg, rewards, batch)
        return batch["advantages"], extra

    mask = torch.tensor([[0.0, 1, 1, 0], [0, 1, 1, 1]])
    batch = {"response_mask": mask}
    rewards = torch.tensor([[1.0, 0.0]])
    grpo, _ = shape(rewards, batch)  # mean 0.5, sample std 0.7071: +-0.5 / 0.7071
    assert torch.allclose(grpo, torch.tensor([[0, 0.7071, 0.7071, 0], [0, -0.7071, -0.7071, -0.7071]]), atol=1e-4)
    cfg.algorithm.advantage = "reinforce_pp"
    rpp, _ = shape(rewards, batch)
    # returns-to-go [1, 1] and [0, 0, 0] over 5 valid tokens: mean 0.4, std 0.4899
    assert torch.allclose(rpp, torch.tensor([[0, 1.2247, 1.2247, 0], [0, -0.8165, -0.8165, -0.8165]]), atol=1e-4)
    cfg.algorithm.kl_in_reward, cfg.algorithm.kl_beta = True, 1.0
    batch.update(old_logprobs=torch.zeros(2, 4), ref_logprobs=torch.full((2, 4), -1.0))
    shaped, extra = shape(rewards, batch)
    assert extra["kl_penalty"] == pytest.approx(KL_ESTIMATORS.get("k3")(torch.zeros(1), -torch.ones(1)).item())
    assert not torch.allclose(shaped, rpp)  # every token paid the penalty: later tokens pay less in total
