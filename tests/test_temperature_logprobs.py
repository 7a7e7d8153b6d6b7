"""Trainer logprobs are taken under the rollout's sampling temperature: for tokens the native
engine sampled at temperature 0.7, the logprobs the trainer computes (manager / reference:
`token_logprobs`; the actor's loss: `rl_loss`) equal the engine's sampling logprobs."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from rlinf_like.data.batch import build_rl_batch
from rlinf_like.hybrid_engines.model_manager import token_logprobs
from rlinf_like.models import load_tokenizer
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.reasoning.config import ReasoningConfig, RunnerConfig
from rlinf_like.runners.reasoning import check_config
from rlinf_like.workers.actor.loss import LossConfig, LossTerms, rl_loss
from rlinf_like.workers.rollout import RolloutConfig, RolloutRequest, SamplingParams, make_engine

TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def sampled(tmp_path_factory):
    path = str(write_tiny_model(tmp_path_factory.mktemp("temp"), TinyModelSpec()))
    tok = load_tokenizer(path)
    engine = make_engine(RolloutConfig(dtype="float32", engine="native", model_path=path, max_batch_size=8))
    params = SamplingParams(max_new_tokens=12, temperature=TEMPERATURE, seed=5)
    results = engine.generate([RolloutRequest(f"r{i}", tok(p).input_ids, params, 2)
                               for i, p in enumerate(["12+34=", "abc", "Q: 7-2? A:"])])
    rows = [(r.prompt_ids, resp, lp) for r in results for resp, lp in zip(r.response_ids, r.logprobs)]
    batch = build_rl_batch(*zip(*rows), [1.0, -1.0] * 3)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, batch


def test_trainer_logprobs_equal_the_rollout_sampling_logprobs(sampled):
    model, batch = sampled
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        ours = token_logprobs(model, batch, TEMPERATURE)
        untempered = token_logprobs(model, batch, 1.0)
    torch.testing.assert_close(ours[mask], batch["old_logprobs"][mask], rtol=0, atol=1e-4)
    assert (untempered[mask] - batch["old_logprobs"][mask]).abs().max() > 1e-2  # the check can fail


def test_actor_loss_sees_ratio_one_under_the_sampling_temperature(sampled):
    model, batch = sampled
    with torch.no_grad():
        _, same = rl_loss(LossConfig(), LossTerms(temperature=TEMPERATURE))(model, batch)
        _, wrong = rl_loss(LossConfig(), LossTerms(temperature=1.0))(model, batch)
    assert same["approx_kl"] < 1e-8 and abs(same["ratio_max"] - 1) < 1e-3 and same["clip_fraction"] == 0
    assert wrong["approx_kl"] > 1e-4


def test_greedy_training_is_refused(tmp_path):
    cfg = ReasoningConfig(runner=RunnerConfig(output_dir=str(tmp_path), temperature=0.0))
    with pytest.raises(ValueError, match=r"runner.temperature must be > 0"):
        check_config(cfg)
