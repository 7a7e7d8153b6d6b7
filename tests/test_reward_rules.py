"""Answer extraction and rule-based rewards."""

import pytest

from rlinf_like.workers.reward import RewardConfig, answers_match, extract_answer, score


@pytest.mark.parametrize("text,answer", [
    ("so the sum is \\boxed{42}.", "42"),
    ("first \\boxed{1} then \\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),  # last box, nested braces
    ("Work: 3+4=7\nAnswer: 7\n", "7"),
    ("answer: 12\nno wait, Answer: 13 apples", "13 apples"),  # the last one counts
    ("\\boxed{unclosed", None),
    ("Answer:   ", None),  # nothing after the colon
    ("Answer:\n5", None),  # the answer must be on the Answer line
    ("answer：3 ", "3"),
    ("just text", None),
])
def test_extract_answer(text, answer):
    assert extract_answer(text) == answer


@pytest.mark.parametrize("pred,ref,same", [
    ("1,234", "1234", True), ("2.50", "5/2", True), ("\\frac{3}{4}", "0.75", True), ("$7.", "7", True),
    ("-3", "3", False), ("Paris", "paris.", True), ("12", "12 apples", False), (None, "1", False),
])
def test_answers_match(pred, ref, same):
    assert answers_match(pred, ref) is same


def test_score_credits_and_penalties():
    config = RewardConfig(correct=1.0, format=0.1, no_eos_penalty=0.5, min_response_tokens=5, short_penalty=0.2)
    assert score("Answer: 7", "7", finished=True, num_tokens=9, config=config).total == 1.0
    assert score("Answer: 8", "7", finished=True, num_tokens=9, config=config).total == pytest.approx(0.1)
    assert score("no idea", "7", finished=True, num_tokens=9, config=config).total == 0.0
    assert score("Answer: 7", "7", finished=False, num_tokens=9, config=config).total == 0.5
    cut = score("Answer: 7", "7", finished=False, num_tokens=3, config=config)
    assert cut.total == pytest.approx(0.3) and cut.correct and cut.answer == "7"
