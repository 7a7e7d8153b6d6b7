"""Rule-based verifiable rewards for reasoning tasks: pure functions of (response text, reference).

The original matcher, and the shaping (format credit, penalties) that the built-in reward functions
share; `builtin.py`'s `math` reward adds GSM8K's `#### N` and math-verify equivalence on top of it.
Here the answer is the content of the last `\\boxed{...}` (nested braces allowed) or, failing that, what
follows the last `Answer:`. Answers compare numerically when both parse as numbers (integers,
decimals, fractions like 3/4, thousands separators, a trailing period or unit-free $), else as
normalised strings. Format reward and penalties follow common practice (torchtune's GRPO recipe
gives partial credit for the format; no-EOS and too-short responses are penalised).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

ANSWER_LINE = re.compile(r"answer[ \t]*[:：][ \t]*(\S[^\n]*)", re.IGNORECASE)  # text on the same line


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}, braces balanced; None if there is none (or it never closes)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j].strip()
    return None


def extract_answer(text: str) -> str | None:
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    matches = ANSWER_LINE.findall(text)
    return matches[-1].strip() if matches else None


def parse_number(text: str) -> Fraction | None:
    """'1,234' -> 1234, '-3/4' -> -3/4, '2.50' -> 5/2, '$7.' -> 7; None if not a plain number."""
    cleaned = text.strip().rstrip(".").replace(",", "").replace("$", "").replace(" ", "")
    cleaned = re.sub(r"^\\frac\{(-?\d+)\}\{(-?\d+)\}$", r"\1/\2", cleaned)
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().rstrip(".").lower())


def answers_match(predicted: str | None, reference: str) -> bool:
    if predicted is None:
        return False
    a, b = parse_number(predicted), parse_number(reference)
    if a is not None and b is not None:
        return a == b
    return normalise(predicted) == normalise(reference)


@dataclass(kw_only=True)  # not frozen: hydra makes a frozen schema read-only, refusing every reward.* override
class RewardConfig:
    correct: float = 1.0  # a correct answer's reward
    format: float = 0.1  # an answer could be extracted at all (well-formed but wrong)
    no_eos_penalty: float = 0.0  # subtracted when the response hit the length limit
    min_response_tokens: int = 0  # shorter responses get `short_penalty` subtracted
    short_penalty: float = 0.0  # subtracted from responses shorter than min_response_tokens
    # the reward function: auto (the data source's: math, or reasoning_gym for that source), a built-in
    # (math, exact, reasoning_gym) or a user's `module:function`
    fn: str = "auto"
    timeout_s: float = 10.0  # time limit of one reward call; past it the sample scores error_value
    error_value: float = 0.0  # the reward of a sample whose reward call raised or timed out
    # learned reward model (workers/reward/model.py); checked by `reward/combine.py`
    kind: str = "rule"  # rule | model | both: reward = rule_weight * rule + model_weight * model score
    rule_weight: float = 1.0  # kind=both: the rule reward's weight
    model_weight: float = 1.0  # kind=both: the model score's weight
    model_path: str = ""  # a *ForSequenceClassification checkpoint (num_labels=1)
    model_micro_batch_size: int | None = 32  # responses per reward-model forward; null: all at once
    model_penalise_no_eos: bool = False  # a truncated response's model score becomes model_penalty
    model_min_response_tokens: int = 0  # shorter responses' model score becomes model_penalty
    model_penalty: float = -3.0  # the model score given to penalised responses
    whiten: bool = False  # whiten the final rewards over each scored batch
    whiten_shift_mean: bool = True  # false: scale only, the mean stays


@dataclass(frozen=True)
class RewardBreakdown:
    total: float
    correct: bool
    formatted: bool
    answer: str | None


def score(response: str, reference: str, finished: bool, num_tokens: int,
          config: RewardConfig = RewardConfig(), extract: Callable[[str], str | None] = extract_answer,
          match: Callable[[str | None, str], bool] = answers_match) -> RewardBreakdown:
    """Reward of one response: `correct` if right, else `format` if an answer was given, minus penalties.
    `extract` and `match` default to the original matcher; the built-in rewards pass their own."""
    answer = extract(response)
    correct = match(answer, reference)
    total = config.correct if correct else (config.format if answer is not None else 0.0)
    if not finished:
        total -= config.no_eos_penalty
    if num_tokens < config.min_response_tokens:
        total -= config.short_penalty
    return RewardBreakdown(total, correct, answer is not None, answer)
