"""Algorithms against values worked out by hand (in the comments)."""

import math

import pytest
import torch

from rlinf_like.algorithms import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    ADVANTAGE_ESTIMATORS,
    PolicyLossConfig,
    entropy_from_logits,
    gae,
    grpo_advantages,
    masked_whiten,
    policy_loss,
    reinforce_pp_advantages,
    rloo_advantages,
    value_loss,
)


def close(a, b, tol=1e-5):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32), atol=tol)


def test_grpo_normalises_within_each_group():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 3.0, 3.0, 3.0]])
    adv = grpo_advantages(rewards)
    # group 1: mean 0.5, sample std sqrt(1/3) -> +-0.5 * sqrt(3) = +-0.8660; group 2: all equal -> 0
    assert close(adv, [[0.866025, -0.866025, -0.866025, 0.866025], [0, 0, 0, 0]], 1e-4)
    assert close(grpo_advantages(rewards, scale_by_std=False)[0], [0.5, -0.5, -0.5, 0.5])


def test_rloo_subtracts_the_mean_of_the_others():
    adv = rloo_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]))
    assert close(adv, [[2 / 3, -2 / 3, -2 / 3, 2 / 3]])  # 1 - 1/3, 0 - 2/3
    with pytest.raises(ValueError, match="at least 2"):
        rloo_advantages(torch.tensor([[1.0]]))


def test_unknown_names_list_the_choices():
    with pytest.raises(KeyError, match=r"unknown advantage estimator 'grop'; allowed: "
                                       r"\['gae', 'grpo', 'opd', 'reinforce_pp', 'rloo'\]"):
        ADVANTAGE_ESTIMATORS.get("grop")
    assert KL_ESTIMATORS.names() == ["k1", "k2", "k3"]


def test_reinforce_pp_returns_to_go_whitened_over_valid_tokens():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = reinforce_pp_advantages(rewards, mask, gamma=1.0)
    # returns [1,1,1] and [2,2,-]: mean 1.4, population std sqrt(0.24) = 0.4899
    assert close(adv, [[-0.816497, -0.816497, -0.816497], [1.224745, 1.224745, 0.0]], 1e-4)
    half = reinforce_pp_advantages(torch.tensor([[0.0, 1.0]]), torch.ones(1, 2), gamma=0.5)
    assert close(half, [[-1.0, 1.0]], 1e-3)  # returns 0.5, 1 -> whitened -1, 1
    # a multi-turn response: tool tokens (mask 0) between two model turns pass the return through undiscounted
    turns = reinforce_pp_advantages(torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]]), torch.tensor([[1.0, 0.0, 0.0, 1.0, 1.0]]),
                                    gamma=0.5)
    # returns 0.25, -, -, 0.5, 1 (a reset at the gap would give the first turn 0): whitened over the valid three
    assert close(turns, [[-1.069045, 0.0, 0.0, -0.267261, 1.336306]], 1e-4)


def test_gae_by_hand_and_padding_changes_nothing():
    # gamma 0.9, lam 0.8: delta1 = 1 - 0.8 = 0.2; delta0 = 0.9*0.8 - 0.5 = 0.22; A0 = 0.22 + 0.72*0.2 = 0.364
    adv, ret = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.8]]), torch.ones(1, 2), gamma=0.9, lam=0.8)
    assert close(adv, [[0.364, 0.2]]) and close(ret, [[0.864, 1.0]])
    adv_p, ret_p = gae(torch.tensor([[0.0, 1.0, 5.0]]), torch.tensor([[0.5, 0.8, 9.0]]),
                       torch.tensor([[1.0, 1.0, 0.0]]), gamma=0.9, lam=0.8)
    assert close(adv_p, [[0.364, 0.2, 0.0]]) and close(ret_p, [[0.864, 1.0, 0.0]])
    # a truncated episode bootstraps from its last value: delta1 = 1 + 0.9*2 - 0.8 = 2.0
    adv_b, _ = gae(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 0.8]]), torch.ones(1, 2), gamma=0.9, lam=0.8,
                   last_values=torch.tensor([2.0]))
    assert close(adv_b[0, 1], 2.0)


def test_policy_loss_clips_each_side_by_hand():
    logprobs = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    old, mask = torch.zeros(1, 3), torch.ones(1, 3)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, metrics = policy_loss(logprobs, old, adv, mask)
    # token 0: max(-1.5, -1.2) = -1.2; token 1: max(0.5, 0.8) = 0.8; token 2: -2  -> mean -0.8
    assert close(loss, -0.8) and metrics["clip_fraction"] == pytest.approx(2 / 3)
    loss_high, _ = policy_loss(logprobs, old, adv, mask, PolicyLossConfig(clip_high=0.28))
    assert close(loss_high, (-1.28 + 0.8 - 2) / 3)
    # dual clip: A = -1 at ratio 5 would cost 5; capped at c * |A| = 3
    big = torch.log(torch.tensor([[5.0]]))
    plain, _ = policy_loss(big, torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1))
    dual, _ = policy_loss(big, torch.zeros(1, 1), torch.tensor([[-1.0]]), torch.ones(1, 1),
                          PolicyLossConfig(dual_clip=3.0))
    assert close(plain, 5.0) and close(dual, 3.0)


def test_policy_loss_gradient_is_zero_where_clipped():
    logprobs = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_()
    loss, _ = policy_loss(logprobs, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1, 2))
    loss.backward()
    # token 0 is clipped (ratio 1.5 > 1.2): no gradient; token 1: d(-ratio/2)/dlogp = -1.1 / 2
    assert close(logprobs.grad, [[0.0, -0.55]])


def test_aggregations_by_hand():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert close(AGGREGATIONS.get("token-mean")(loss, mask), 2.5)  # 10 / 4 tokens
    assert close(AGGREGATIONS.get("seq-mean-token-mean")(loss, mask), 3.0)  # (2 + 4) / 2
    assert close(AGGREGATIONS.get("seq-mean-token-sum")(loss, mask), 5.0)  # (6 + 4) / 2


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert close(KL_ESTIMATORS.get("k1")(logp, ref), math.log(2))
    assert close(KL_ESTIMATORS.get("k2")(logp, ref), 0.5 * math.log(2) ** 2)
    assert close(KL_ESTIMATORS.get("k3")(logp, ref), 0.5 + math.log(2) - 1)  # exp(-log2) + log2 - 1
    assert close(KL_ESTIMATORS.get("k3")(ref, ref), 0.0)


def test_value_loss_takes_the_worse_of_clipped_and_unclipped():
    loss = value_loss(torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.tensor([[2.0]]), torch.ones(1, 1), clip=0.2)
    assert close(loss, 0.5 * 1.69)  # clipped value 0.7: (0.7 - 2)^2 = 1.69 > (1 - 2)^2


def test_entropy_and_whitening():
    assert close(entropy_from_logits(torch.zeros(2, 4)), [math.log(4)] * 2)
    assert close(entropy_from_logits(torch.tensor([[0.0, -1e9]])), [0.0])
    x, mask = torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1.0, 1.0, 0.0])
    assert close(masked_whiten(x, mask), [-1.0, 1.0, 0.0], 1e-3)  # the padded 100 moves nothing
