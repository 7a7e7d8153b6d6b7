"""PPO's critic: the value worker on two FSDP ranks (values equal an unsharded forward; it learns
fixed returns) and the runner's GAE advantages and returns, against hand-computed values."""

import pytest
import torch

from rlinf_like.algorithms import masked_whiten
from rlinf_like.algorithms.advantage_estimators.gae import GAEOptions
from rlinf_like.data.batch import build_rl_batch
from rlinf_like.hybrid_engines.fsdp import FSDPConfig
from rlinf_like.hybrid_engines.model_manager import OptimConfig
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.reasoning.config import ActorSection, AlgorithmConfig, ReasoningConfig, RunnerConfig
from rlinf_like.algorithms import build_estimator
from rlinf_like.runners.reasoning.phases import advantages
from rlinf_like.runners.reasoning import check_batch_split, check_config
from rlinf_like.workers.critic import CriticConfig, CriticWorker
from rlinf_like.training.loop import LoopConfig


def toy_batch(rows=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 60, (int(torch.randint(3, 7, (1,), generator=g)),), generator=g).tolist()
               for _ in range(rows)]
    responses = [torch.randint(3, 60, (int(torch.randint(2, 6, (1,), generator=g)),), generator=g).tolist()
                 for _ in range(rows)]
    batch = build_rl_batch(prompts, responses, [[0.0] * len(r) for r in responses], [0.0] * rows)
    # a learnable target: +1 on every response token when the prompt starts with an even token, else -1
    sign = torch.tensor([1.0 if p[0] % 2 == 0 else -1.0 for p in prompts]).unsqueeze(1)
    batch["returns"] = sign * batch["response_mask"]
    return batch


@pytest.fixture()
def critic(cluster, tmp_path):
    path = write_tiny_model(tmp_path / "model", TinyModelSpec(init_std=0.02))
    config = CriticConfig(model_path=str(path), fsdp=FSDPConfig(optim=OptimConfig(lr=3e-3, clip_grad=None)),
                          loop=LoopConfig(mini_batches=1, micro_batch_size=2, epochs=4), value_clip=None)
    group = CriticWorker.create_group(config).launch(cluster, cluster.place({"critic": "0-1"}), "critic")
    yield group, path
    group.shutdown()


def test_critic_values_match_an_unsharded_forward_and_it_learns_returns(critic):
    from transformers import AutoModelForTokenClassification

    group, path = critic
    batch = toy_batch()
    values = torch.cat(group.compute_values(batch).wait(timeout=120))  # ranks return their rows in order
    torch.manual_seed(1)  # the worker seeds loop.seed + 1 before the value head is initialised
    reference = AutoModelForTokenClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
    with torch.no_grad():
        expected = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1, 0]
    torch.testing.assert_close(values, expected, rtol=1e-5, atol=1e-5)

    mask = batch["response_mask"]
    def mse(v):
        return float(((v - batch["returns"]) ** 2 * mask).sum() / mask.sum())

    before = mse(values)
    batch["old_values"] = values
    for _ in range(10):
        metrics = group.train_step(batch).wait(timeout=120)[0]
    after = mse(torch.cat(group.compute_values(batch).wait(timeout=120)))
    assert {"value_loss", "value_mse", "critic_grad_norm"} <= set(metrics)
    assert after < 0.1 * before, (before, after)


def gae_advantages(rewards, batch, **algorithm):
    """The runner's advantage phase for algorithm.advantage=gae (the critic's returns land in batch)."""
    cfg = ReasoningConfig(algorithm=AlgorithmConfig(advantage="gae", gae=GAEOptions(**algorithm)))
    check_config(cfg)
    advantages(build_estimator("gae", cfg.algorithm), cfg, rewards, batch)
    return batch["advantages"]


def one_row_batch():
    # positions 1..3 are response tokens; the outcome reward 1 lands on the last one
    return {"response_mask": torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]]),
            "old_values": torch.tensor([[9.0, 0.2, 0.5, 0.7, 9.0]])}


def test_gae_with_lambda_one_regresses_on_the_outcome(tmp_path):
    batch = one_row_batch()
    advantages = gae_advantages(torch.tensor([[1.0]]), batch, gamma=1.0, lam=1.0)
    mask = batch["response_mask"]
    assert torch.equal(batch["returns"], torch.tensor([[0.0, 1.0, 1.0, 1.0, 0.0]]))  # R on every response token
    raw = torch.tensor([[0.0, 0.8, 0.5, 0.3, 0.0]])  # R - V(s_t)
    torch.testing.assert_close(advantages, masked_whiten(raw, mask) * mask)


def test_gae_with_lambda_zero_is_the_td_residual(tmp_path):
    batch = one_row_batch()
    advantages = gae_advantages(torch.tensor([[1.0]]), batch, gamma=1.0, lam=0.0)
    mask = batch["response_mask"]
    raw = torch.tensor([[0.0, 0.5 - 0.2, 0.7 - 0.5, 1.0 - 0.7, 0.0]])  # r_t + V(s_t+1) - V(s_t)
    torch.testing.assert_close(batch["returns"], torch.tensor([[0.0, 0.5, 0.7, 1.0, 0.0]]))
    torch.testing.assert_close(advantages, masked_whiten(raw, mask) * mask)


def test_rows_that_do_not_split_over_ranks_fail_naming_the_keys():
    cfg = ReasoningConfig(runner=RunnerConfig(prompts_per_step=3), algorithm=AlgorithmConfig(samples_per_prompt=3))
    with pytest.raises(ValueError, match=r"runner.prompts_per_step x algorithm.samples_per_prompt = 9 rows .* "
                                         r"critic ranks \(2\) x actor.loop.mini_batches \(1\)"):
        check_batch_split(cfg, {"actor": 1, "critic": 2})


def test_a_token_budget_lifts_the_even_split_rule_but_each_mini_batch_needs_a_row_per_rank():
    cfg = ReasoningConfig(runner=RunnerConfig(prompts_per_step=3), algorithm=AlgorithmConfig(samples_per_prompt=3),
                          actor=ActorSection(loop=LoopConfig(max_tokens_per_micro_batch=64, mini_batches=2)))
    check_batch_split(cfg, {"actor": 2, "critic": 2})  # 9 rows, 2 ranks x 2 mini-batches: the plan evens it out
    cfg.actor.loop.max_tokens_per_micro_batch = None
    with pytest.raises(ValueError, match=r"9 rows per step do not divide by actor ranks \(2\) x actor.loop.mini_batches "
                                         r"\(2\).*or set actor.loop.max_tokens_per_micro_batch"):
        check_batch_split(cfg, {"actor": 2})
    cfg.actor.loop.max_tokens_per_micro_batch, cfg.actor.loop.mini_batches = 64, 5
    with pytest.raises(ValueError, match=r"9 rows per step cannot give each of critic ranks \(2\) a row in each of "
                                         r"actor.loop.mini_batches \(5\)"):
        check_batch_split(cfg, {"critic": 2})
