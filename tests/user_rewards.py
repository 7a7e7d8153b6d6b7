"""An example user reward module, as `reward.fn=user_rewards:where_scored` names it. The tests folder
is on the Ray workers' path (the driver's source folders are), so the reward worker can import it."""

import os


def where_scored(response: str, answer: str, **info) -> dict:
    """1 when the answer appears in the response; reports the process that scored it, the response's
    length and the data row's `level` column."""
    return {"reward": float(answer in response), "pid": os.getpid(), "num_tokens": info["num_tokens"],
            "level": info.get("level", -1)}


def gsm8k_row(response: str, answer: str, **info) -> dict:
    """A GSM8K reward over the built-in answer extraction (`#### N`, `\\boxed{}`, `Answer:`), reporting what
    it was called with: the lengths of the row's `question` column and of the prompt as the model saw it, and
    whether the reference it got is the reduced final answer (a number) rather than the row's whole solution."""
    from rlinf_like.workers.reward.builtin import extract_final_answer, math_equal
    from rlinf_like.workers.reward.rules import parse_number

    correct = math_equal(extract_final_answer(response), answer)
    return {"reward": float(correct), "correct": correct, "question_chars": len(info["question"]),
            "prompt_chars": len(info["prompt"]),
            "reference_is_number": float(parse_number(answer) is not None)}


def digits(response: str, answer: str, **info) -> float:
    """The share of digits in the response: rewards that differ within a group from the first step on,
    so an untrained model's run has advantages and its weights move (tests/test_offpolicy.py)."""
    return sum(c.isdigit() for c in response) / max(len(response), 1)
