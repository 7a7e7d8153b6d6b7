"""On-policy distillation (`algorithm.advantage=opd`): per-token advantages are the teacher's logprob minus the
student's (optionally plus the task reward's group advantage), the teacher is a frozen worker group of its own,
refused before any worker starts when its tokenizer or vocabulary is not the student's, and a run resumes."""

import json
from pathlib import Path

import pytest
import torch

from rlinf_like.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInputs, build_estimator
from rlinf_like.models.tiny import TinyModelSpec, write_tiny_model
from rlinf_like.runners.reasoning import check_config, train
from rlinf_like.runners.reasoning.config import AlgorithmConfig
from small_runs import in_process, small_reasoning_config


def test_advantages_are_the_teacher_minus_the_student_per_token():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    student = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -0.5, -0.5]])
    teacher = torch.tensor([[-0.5, -3.0, -1.0], [-0.5, -1.5, 0.0]])
    rewards = torch.tensor([[1.0, 0.0]])  # one prompt, two samples
    inputs = AdvantageInputs(rewards=rewards, response_mask=mask, logprobs=student, teacher_logprobs=teacher)
    algorithm = AlgorithmConfig(advantage="opd")
    out = build_estimator("opd", algorithm).estimate(inputs)
    assert torch.equal(out.advantages, torch.tensor([[0.5, -1.0, 0.0], [0.0, -1.0, 0.5]]))
    # reverse KL estimate: mean over the 5 response tokens of student - teacher = (-0.5 + 1 + 0 + 1 - 0.5) / 5
    assert out.metrics["opd/reverse_kl"] == pytest.approx(0.2)
    algorithm.opd.reward_weight = 0.5  # + 0.5 x GRPO's advantage (+-0.7071 for rewards 1, 0), on response tokens
    mixed = build_estimator("opd", algorithm).estimate(inputs).advantages
    grpo = 0.5 * 2 ** -0.5 / (1 + 1e-6 * 2 ** 0.5)
    expected = torch.tensor([[0.5 + grpo, -1.0 + grpo, 0.0], [0.0 - grpo, -1.0 - grpo, 0.5 - grpo]])
    assert torch.allclose(mixed, expected, atol=1e-5)
    assert ADVANTAGE_ESTIMATORS.get("opd").needs_teacher and ADVANTAGE_ESTIMATORS.get("opd").token_level


def teacher_model(tmp_path: Path, **spec) -> str:
    """A tiny model over the student's character tokenizer: deeper, another seed."""
    return str(write_tiny_model(tmp_path / "teacher", TinyModelSpec(num_layers=3, seed=1, **spec)))


def copy_model(src: str, dst: Path) -> Path:
    dst.mkdir()
    for f in Path(src).iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def opd_config(out: Path, teacher: str, steps: int = 2, resume: bool = False):
    cfg = small_reasoning_config(out, max_steps=steps, save_every=1, samples_per_prompt=2)
    cfg.algorithm.advantage, cfg.teacher.model_path = "opd", teacher
    cfg.runner.resume = resume
    return in_process(cfg, {"actor,rollout,teacher": "0", "reward": "1"})


def test_the_teacher_is_refused_by_name_before_any_worker(tmp_path):
    teacher = teacher_model(tmp_path)
    cfg = opd_config(tmp_path / "run", "")
    with pytest.raises(ValueError, match=r"algorithm.advantage=opd needs teacher.model_path"):
        check_config(cfg)
    cfg = opd_config(tmp_path / "run", teacher)
    cfg.algorithm.advantage = "grpo"
    with pytest.raises(ValueError, match=r"teacher.model_path=.* is read by algorithm.advantage=opd only"):
        check_config(cfg)
    swapped = copy_model(teacher, tmp_path / "swapped")  # the same files with two tokens' ids exchanged
    tok = json.loads((swapped / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (swapped / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match=r"its tokenizer is not the student's \(the tiny model .*\): 4 \(token, id\) "
                                         r"pairs differ"):
        check_config(opd_config(tmp_path / "run", str(swapped)))
    wider = copy_model(teacher, tmp_path / "wider")  # the config's vocabulary grown (padding rows)
    config = json.loads((wider / "config.json").read_text())
    config["vocab_size"] += 64
    (wider / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"has vocab_size \d+, the student \(the tiny model .*\) \d+"):
        check_config(opd_config(tmp_path / "run", str(wider)))


@pytest.mark.timeout(300)
def test_a_distillation_run_resumes_where_it_stopped(tmp_path):
    teacher = teacher_model(tmp_path)
    first = train(opd_config(tmp_path / "run", teacher, 2)).history
    resumed = train(opd_config(tmp_path / "run", teacher, 3, resume=True)).history
    straight = train(opd_config(tmp_path / "straight", teacher, 3)).history  # the uninterrupted run, to compare
    steps = [h for h in first if "loss" in h]
    assert len(steps) == 2 and all("opd/reverse_kl" in h and h["teacher_s"] > 0 for h in steps)
    assert resumed[: len(first)] == first
    last = lambda history: next(h for h in reversed(history) if "loss" in h)  # noqa: E731
    assert last(resumed)["step"] == 3 and last(resumed)["opd/reverse_kl"] == last(straight)["opd/reverse_kl"]


def test_a_student_distilled_from_itself_starts_at_zero_reverse_kl(tmp_path):
    """The teacher's logprobs line up with the rollout's token by token: with the student's own starting weights
    as the teacher, the first step's per-token reverse KL is ~0 (measured -0.0013 on SmolLM2's 8-layer student).
    A teacher scoring shifted positions or other rows reads far more."""
    from rlinf_like.runners.reasoning.run import model_path

    cfg = opd_config(tmp_path / "run", "", steps=1)
    cfg.model.init_std = 0.5  # peaked next-token distributions: near-uniform ones would agree however misaligned
    cfg.teacher.model_path = model_path(cfg, tmp_path / "run")  # the tiny model the run starts from
    [step] = [h for h in train(cfg).history if "loss" in h]
    # measured 0.03 here (a bf16 rollout against the teacher's forward); teacher logprobs shifted by one position: 1.56
    assert abs(step["opd/reverse_kl"]) < 0.2
