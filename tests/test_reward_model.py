"""Learned reward model (scores at the last real token, left/right padding), the torchtune-style
penalty rules, whitening, and how rule and model rewards combine in the RewardWorker."""

import pytest
import torch

from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.workers.reward import RewardConfig
from rlinf_like.workers.reward.combine import check_reward_config, combine_rewards
from rlinf_like.workers.reward.model import RewardModel, last_token_index, pad_rows, sequence_scores
from rlinf_like.workers.reward.penalties import apply_penalty, penalty_mask, whiten
from rlinf_like.workers.reward.worker import RewardWorker
from rlinf_like.workers.rollout.types import RolloutResult


@pytest.fixture(scope="module")
def reward_model_path(tmp_path_factory):
    """A tiny Qwen2 backbone with a fresh one-label score head, saved as a reward-model checkpoint."""
    from transformers import AutoModelForSequenceClassification

    root = tmp_path_factory.mktemp("rm")
    base = write_tiny_model(root / "base", TinyModelSpec(init_std=0.2))
    torch.manual_seed(3)
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1, dtype=torch.float32)
    model.save_pretrained(root / "rm")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (base / f).exists():
            (root / "rm" / f).write_bytes((base / f).read_bytes())
    return str(root / "rm")


ROWS = [[5, 9, 14, 22, 7], [30, 31], [8, 8, 40, 41, 42, 43, 44, 9], [17, 2]]  # 2 = EOS of the tiny tokenizer


def unpadded_reference(path, rows):
    """Each row alone, no padding: HF's own pooling takes the last token."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32).eval()
    with torch.no_grad():
        return torch.stack([model(input_ids=torch.tensor([r])).logits[0, 0] for r in rows])


def test_last_token_index_for_left_and_right_padding():
    _, right = pad_rows(ROWS, 0, "right")
    _, left = pad_rows(ROWS, 0, "left")
    assert last_token_index(right).tolist() == [4, 1, 7, 1]
    assert last_token_index(left).tolist() == [7, 7, 7, 7]
    with pytest.raises(ValueError, match="no tokens"):
        last_token_index(torch.tensor([[1, 1], [0, 0]]))


@pytest.mark.parametrize("side", ["right", "left"])
def test_scores_equal_an_unpadded_forward_at_the_last_real_token(reward_model_path, side):
    expected = unpadded_reference(reward_model_path, ROWS)
    assert expected.std() > 1e-3  # the rows really score differently
    rm = RewardModel(reward_model_path, micro_batch_size=3)  # two micro-batches
    # pad id 2 is EOS: it also ends the last row, and must not be taken for padding
    ids, mask = pad_rows(ROWS, 2, side)
    with torch.no_grad():
        got = sequence_scores(rm.model, ids, mask)
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-5)
    torch.testing.assert_close(rm.score(ROWS), expected, rtol=0, atol=2e-5)


def test_penalty_rules_and_whitening_exact_values():
    finished = torch.tensor([True, False, True, False])
    lengths = torch.tensor([10, 10, 2, 1])
    assert penalty_mask(finished, lengths, True, 0).tolist() == [False, True, False, True]
    assert penalty_mask(finished, lengths, False, 3).tolist() == [False, False, True, True]
    assert penalty_mask(finished, lengths, True, 3).tolist() == [False, True, True, True]
    assert penalty_mask(finished, lengths, False, 0).tolist() == [False] * 4
    scores = torch.tensor([0.5, 2.0, -1.0, 4.0])
    assert apply_penalty(scores, torch.tensor([False, True, False, True]), -3.0).tolist() == [0.5, -3.0, -1.0, -3.0]
    x = torch.tensor([1.0, 2.0, 3.0, 6.0])  # mean 3, population var 3.5
    expected = (x - 3.0) / (3.5 + 1e-8) ** 0.5
    torch.testing.assert_close(whiten(x), expected, rtol=0, atol=1e-7)
    torch.testing.assert_close(whiten(x, shift_mean=False), expected + 3.0, rtol=0, atol=1e-7)


def test_combine_rule_model_both_with_weights_penalties_and_whitening():
    rule = torch.tensor([1.0, 0.1, 0.0])
    model = torch.tensor([0.7, -0.2, 5.0])
    finished, lengths = torch.tensor([True, True, False]), torch.tensor([8, 8, 8])
    cfg = RewardConfig(kind="both", model_path="x", rule_weight=2.0, model_weight=0.5, model_penalise_no_eos=True,
                       model_penalty=-1.0)
    total, pen = combine_rewards(cfg, rule, model, finished, lengths)
    assert pen.tolist() == pytest.approx([0.7, -0.2, -1.0])
    assert total.tolist() == pytest.approx([2.35, 0.1, -0.5])
    total, _ = combine_rewards(RewardConfig(kind="model", model_path="x", model_weight=2.0), rule, model, finished,
                               lengths)
    assert total.tolist() == pytest.approx([1.4, -0.4, 10.0])
    total, pen = combine_rewards(RewardConfig(whiten=True), rule, None, finished, lengths)
    assert pen is None and total.tolist() == pytest.approx(whiten(rule).tolist())


@pytest.mark.parametrize("change,message", [
    (dict(kind="learned"), r"reward.kind='learned' is not one of \['both', 'model', 'rule'\]"),
    (dict(kind="model"), r"reward.kind='model' needs reward.model_path"),
    (dict(kind="both", model_path="m", rule_weight=0.0, model_weight=0.0),
     "reward.kind='both' with reward.rule_weight=0 and reward.model_weight=0 gives no reward"),
    (dict(kind="model", model_path="m", model_weight=0.0), "reward.kind='model' with reward.model_weight=0 gives"),
    (dict(model_weight=float("nan")), r"reward.model_weight must be finite"),
    (dict(model_min_response_tokens=-1), r"reward.model_min_response_tokens must be >= 0"),
])
def test_bad_reward_config_is_named(change, message):
    with pytest.raises(ValueError, match=message):
        check_reward_config(RewardConfig(**change))


def test_reward_worker_combines_rules_and_the_model(reward_model_path, cluster):
    """The worker as the runner calls it: one request, two samples (one right, one truncated)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(reward_model_path)
    prompt = tok("1+2=").input_ids
    right, wrong = tok("Answer: 3").input_ids + [tok.eos_token_id], tok("Answer: 4").input_ids
    result = RolloutResult("r0", prompt, [right, wrong], [[0.0] * len(right), [0.0] * len(wrong)], ["stop", "length"])
    cfg = RewardConfig(kind="both", model_path=reward_model_path, rule_weight=1.0, model_weight=0.5,
                       model_penalise_no_eos=True, model_penalty=-2.0)
    group = RewardWorker.create_group(reward_model_path, cfg).launch(cluster, cluster.place({"reward": "0"}), "reward",
                                                                   init_process_group=False)
    try:
        [[a, b]] = group.score([result], ["3"]).wait(timeout=120)[0]
    finally:
        group.shutdown()
    scores = unpadded_reference(reward_model_path, [prompt + right])
    assert (a.correct, b.correct) == (True, False)
    assert a.rule_reward == 1.0 and b.rule_reward == pytest.approx(0.1)
    assert a.model_score == pytest.approx(float(scores[0]), abs=2e-5) and b.model_score == -2.0
    assert a.reward == pytest.approx(1.0 + 0.5 * float(scores[0]), abs=2e-5)
    assert b.reward == pytest.approx(0.1 - 1.0)


def test_reward_keys_override_through_hydra_and_are_checked_before_launch(tmp_path):
    """The preset composes with reward.* overrides (a frozen schema made hydra refuse them all)."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore

    from rlinf_like.config import hydra_schema, structure
    from rlinf_like.runners.reasoning.config import ReasoningConfig
    from rlinf_like.runners.reasoning import check_config

    ConfigStore.instance().store(name="reasoning_schema", node=hydra_schema(ReasoningConfig))
    config_dir = Path(__file__).resolve().parents[1] / "examples" / "reasoning" / "config"
    with initialize_config_dir(str(config_dir), version_base="1.3"):
        cfg = compose("grpo_collocated", ["reward.kind=both", "reward.model_weight=0.5", "reward.whiten=true",
                                          f"runner.output_dir={tmp_path}"])
    parsed = structure(ReasoningConfig, cfg)
    assert (parsed.reward.kind, parsed.reward.model_weight, parsed.reward.whiten) == ("both", 0.5, True)
    with pytest.raises(ValueError, match=r"reward.kind='both' needs reward.model_path"):
        check_config(parsed)
