"""Task generation, and reading JSONL rows."""

import json

import pytest

from rlinf_like.data.tasks import ArithmeticSpec, arithmetic_problems, split_train_test
from rlinf_like.workers.reward import score


def test_arithmetic_is_deterministic_correct_and_rewardable():
    spec = ArithmeticSpec(terms=3, max_operand=20, operators="+-*")
    a, b = arithmetic_problems(50, seed=3, spec=spec), arithmetic_problems(50, seed=3, spec=spec)
    assert a == b and a != arithmetic_problems(50, seed=4, spec=spec)
    for p in a:
        assert eval(p.prompt[:-1]) == int(p.answer)  # the reference is the expression's value
        assert score(p.solution, p.answer, finished=True, num_tokens=10).correct


def test_worked_solutions_show_each_step():
    from rlinf_like.data.tasks import worked_solution

    assert worked_solution([3, 5, 2], ["+", "-"]) == "3+5=8, 8-2=6. Answer: 6"
    assert worked_solution([3, 5], ["+"]) == "Answer: 8"
    assert worked_solution([3, 5, 2], ["+", "*"]) == "Answer: 13"  # precedence: no left-to-right steps


def test_held_out_is_disjoint_from_train():
    train, test = split_train_test(200, 50, seed=0)
    assert len(test) == 50 and not {p.prompt for p in train} & {p.prompt for p in test}
    with pytest.raises(ValueError, match="held-out"):
        split_train_test(500, 200, seed=0, spec=ArithmeticSpec(max_operand=3))  # only 32 distinct problems


def test_jsonl_formats(tmp_path):
    """The row shapes a JSONL file may hold: GSM8K's question / "#### N" answer, a plain prompt / answer, and
    chat messages whose last assistant turn is the answer (no answer column)."""
    from rlinf_like.data.config import DataConfig
    from rlinf_like.data.sources.files import read_problems

    path = tmp_path / "data.jsonl"
    rows = [{"question": "2 apples and 3 more?", "answer": "2+3=5\n#### 5"}, {"question": "7*6=", "answer": "42"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    problems = read_problems(str(path), DataConfig(prompt_key="question"), "train")
    assert [(p.prompt, p.answer, p.solution) for p in problems] == [
        ("2 apples and 3 more?", "5", "2+3=5\n#### 5"), ("7*6=", "42", "42")]
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1?"},
                                             {"role": "assistant", "content": "2"}]}))
    [p] = read_problems(str(chat), DataConfig(prompt_key="messages"), "train")
    assert (p.prompt, p.answer, p.messages) == ("1+1?", "2", ({"role": "user", "content": "1+1?"},))
    path.write_text(json.dumps({"text": "x"}))
    with pytest.raises(ValueError, match=r"data.jsonl: data.prompt_key='prompt' is not a column \(columns: \['text'\]\)"):
        read_problems(str(path), DataConfig(), "train")
