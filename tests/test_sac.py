"""SAC: the pure math against hand-computed tensors, the squashed-Gaussian log-prob, the replay buffer's
n-step folding, and learning Pendulum-v1 in one process within a CI budget."""

import math

import numpy as np
import pytest
import torch

from rlinf_like.algorithms.sac import (
    actor_loss,
    fold_n_step,
    polyak_update,
    soft_q_target,
    temperature_loss,
    twin_q_min,
)
from rlinf_like.data.replay import ReplayBuffer, Transitions
from rlinf_like.envs import EnvConfig
from rlinf_like.models.sac import SquashedGaussianActor, TwinQ


def test_twin_q_min_takes_the_smaller_critic_per_row():
    q1, q2 = torch.tensor([1.0, -2.0, 3.0]), torch.tensor([0.5, -1.0, 3.0])
    assert torch.equal(twin_q_min(q1, q2), torch.tensor([0.5, -2.0, 3.0]))


def test_soft_q_target_by_hand():
    # y = r + discount * (1 - term) * (minQ' - alpha * logp')
    r, term = torch.tensor([1.0, 2.0]), torch.tensor([False, True])
    y = soft_q_target(r, term, 0.9, torch.tensor([10.0, 10.0]), torch.tensor([-1.0, -1.0]), 0.5)
    assert torch.allclose(y, torch.tensor([1.0 + 0.9 * (10.0 + 0.5), 2.0]))
    # per-row discount (n-step: gamma^k), terminal folded into the discount
    y = soft_q_target(r, torch.zeros(2), torch.tensor([0.81, 0.0]), torch.tensor([4.0, 4.0]), torch.zeros(2), 0.2)
    assert torch.allclose(y, torch.tensor([1.0 + 0.81 * 4.0, 2.0]))


def test_temperature_loss_by_hand_and_its_gradient_sign():
    log_alpha = torch.tensor(math.log(0.5), requires_grad=True)
    logp = torch.tensor([-0.5, 0.5], requires_grad=True)  # entropy 0 on average, target -1: entropy too high
    loss = temperature_loss(log_alpha, logp, target_entropy=-1.0)
    assert loss.item() == pytest.approx(-math.log(0.5) * ((-0.5 - 1.0) + (0.5 - 1.0)) / 2)
    loss.backward()
    assert logp.grad is None or torch.all(logp.grad == 0)  # only alpha learns
    assert log_alpha.grad.item() == pytest.approx(1.0)  # -(mean(logp) + target) = 1 > 0: alpha goes down
    assert actor_loss(torch.tensor([-1.0, 1.0]), torch.tensor([2.0, 4.0]), 0.5).item() == pytest.approx(-3.0)


def test_polyak_update_by_hand():
    target, source = [torch.tensor([0.0, 10.0]), torch.tensor([[1.0]])], [torch.tensor([1.0, 0.0]), torch.tensor([[3.0]])]
    polyak_update(target, source, tau=0.1)
    assert torch.allclose(target[0], torch.tensor([0.1, 9.0])) and torch.allclose(target[1], torch.tensor([[1.2]]))
    assert torch.equal(source[0], torch.tensor([1.0, 0.0]))  # the source is untouched


def test_fold_n_step_cuts_at_the_first_terminal():
    assert fold_n_step(np.array([1.0, 2.0, 4.0]), np.array([False] * 3), 0.5) == (1.0 + 1.0 + 1.0, False, 3)
    assert fold_n_step(np.array([1.0, 2.0, 4.0]), np.array([False, True, False]), 0.5) == (2.0, True, 2)


def test_squashed_gaussian_logp_matches_the_change_of_variables():
    torch.manual_seed(0)
    actor = SquashedGaussianActor(3, 2, [8])
    obs = torch.randn(5, 3)
    torch.manual_seed(1)
    a, logp = actor(obs)
    h = actor.trunk(obs)
    mu, std = actor.mu(h), actor.log_std(h).clamp(-20, 2).exp()
    u = torch.atanh(a.clamp(-1 + 1e-6, 1 - 1e-6))
    ref = torch.distributions.Normal(mu, std).log_prob(u).sum(-1) - torch.log(1 - a ** 2).sum(-1)
    assert torch.allclose(logp, ref, atol=1e-3) and a.abs().max() < 1


def test_twin_q_members_are_independent_critics():
    q = TwinQ(3, 1, [4])
    out = q(torch.randn(6, 3), torch.randn(6, 1))
    assert out.shape == (2, 6) and not torch.allclose(out[0], out[1])


def chunk(rewards, terminated, truncated, rank=0):
    t = len(rewards)
    obs = np.arange(t, dtype=np.float32)[:, None, None]  # obs_t = t, next_obs_t = t + 1
    return Transitions(obs, np.zeros((t, 1, 1), np.float32), np.array(rewards, np.float32)[:, None], obs + 1,
                       np.array(terminated)[:, None], np.array(truncated)[:, None], rank)


def test_replay_n_step_folds_windows_and_flushes_at_episode_ends():
    buf = ReplayBuffer(16, (1,), (1,), gamma=0.5, n_step=2)
    # steps 0..3; step 2 terminal (episode ends), step 3 starts a new one and truncates
    buf.add(chunk([1, 2, 4, 8], [False, False, True, False], [False, False, False, True]))
    got = [(float(buf.obs[i, 0]), float(buf.reward[i]), float(buf.discount[i]), float(buf.next_obs[i, 0]))
           for i in range(len(buf))]
    assert got == [(0, 1 + 0.5 * 2, 0.25, 2),  # full window: 2 steps, bootstrap gamma^2 from s2
                   (1, 2 + 0.5 * 4, 0.0, 3),  # window cut by the terminal at step 2: no bootstrap
                   (2, 4, 0.0, 3),  # the terminal step alone
                   (3, 8, 0.5, 4)]  # truncated: one step, bootstrap from its final obs


def test_replay_ring_overwrites_and_samples_stored_rows():
    buf = ReplayBuffer(4, (1,), (1,), gamma=0.9)
    buf.add(chunk([1, 2, 3, 4, 5, 6], [False] * 6, [False] * 6))
    assert len(buf) == 4 and buf.added == 6 and sorted(buf.obs[:, 0].tolist()) == [2, 3, 4, 5]
    [batch] = buf.sample(32, 1, np.random.default_rng(0))
    assert set(batch["obs"][:, 0].tolist()) <= {2, 3, 4, 5}
    assert torch.allclose(batch["next_obs"], batch["obs"] + 1) and torch.all(batch["discount"] == 0.9)


@pytest.mark.extended
def test_sac_learns_pendulum():
    """From ~-1200 (random) to above -400 mean return over the last 5 episodes, in one process. Seeds 0-4 on an Intel
    Xeon (AVX-512, AMX): first 2 episodes -1741 to -1110, last 5 -202 to -129: each bound ~200 from the nearest."""
    from bench.sac_local import run_local_sac
    from rlinf_like.workers.actor.sac_learner import SACConfig

    torch.set_num_threads(1)
    sac = SACConfig(batch_size=128, learning_starts=500, buffer_size=20_000)
    result = run_local_sac(EnvConfig(kind="gym", id="Pendulum-v1", num_envs=1), sac, total_env_steps=PENDULUM_STEPS,
                           hidden=[64, 64], lr=1e-3, seed=0)
    first, last = np.mean(result.episode_returns[:2]), np.mean(result.episode_returns[-5:])
    assert first < -900 and last > -400, (first, last, result.episode_returns)


PENDULUM_STEPS = 5000
