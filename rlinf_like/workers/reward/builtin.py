"""The built-in reward functions (`reward.fn=math`, `exact`, `reasoning_gym`), with the documented signature
`fn(response, answer, **info) -> dict` plus the `config` keyword that only built-ins receive.

`math` extracts the last `\\boxed{}`, else the later of GSM8K's `#### N` and `Answer:`, and compares
with math-verify (`\\dfrac{1}{2}` = 0.5, `x=3` = 3, `50\\%` = 0.5, sets in any order). Two plain numbers
still compare exactly as the original matcher did (fast, and the arithmetic task's rewards stay
bit-identical); whatever it accepted is still accepted. math-verify runs without its own timeouts: they
use `signal.alarm`, which fails outside the main thread; `fn.call_with_timeout` limits the call instead.
"""

from __future__ import annotations

import logging
import re

# imports sympy (~1 s), here rather than inside the first call, which runs under reward.timeout_s: on a loaded
# machine the import alone could time that call out and change its reward
from math_verify import parse, verify

from rlinf_like.workers.reward.rules import (
    ANSWER_LINE,
    RewardConfig,
    answers_match,
    last_boxed,
    normalise,
    parse_number,
    score,
)


class _NoTimeoutWarning(logging.Filter):
    """Drops math-verify's "Timeout is disabled ..." warning (its parser and its grader each log it once per
    process, so twice in the driver and in every reward worker): the timeouts are off on purpose, and
    `reward.timeout_s` limits each call instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_NoTimeoutWarning())

_GSM8K = re.compile(r"####[ \t]*(\S[^\n]*)")  # GSM8K solutions end with "#### 42"
_WORDS = re.compile(r"[^\W\d_]{2,}(\s+[^\W\d_]+)*\.?")  # "Paris": math-verify reads it as p*a*r*i*s


def extract_final_answer(text: str) -> str | None:
    """The last `\\boxed{}`; else whichever of `#### N` and `Answer: ...` comes last; else None."""
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    found = [(m.start(), m.group(1).strip()) for pattern in (_GSM8K, ANSWER_LINE) for m in pattern.finditer(text)]
    return max(found)[1] if found else None


def _latex(text: str) -> str:
    """An answer as math-verify parses it best: inside $...$, `\\%` as a plain percent sign."""
    text = text.replace("\\%", "%")
    return text if "$" in text else f"${text}$"


def math_equal(predicted: str | None, reference: str) -> bool:
    """Whether a predicted answer equals the reference, mathematically."""
    if predicted is None:
        return False
    if parse_number(predicted) is not None and parse_number(reference) is not None:
        return answers_match(predicted, reference)  # two numbers: compared exactly, not symbolically
    if answers_match(predicted, reference):
        return True
    if _WORDS.fullmatch(predicted.strip()) or _WORDS.fullmatch(reference.strip()):
        return False  # words: the normalised string comparison above decides (math-verify: "cat" = "act")
    gold = parse(_latex(reference), parsing_timeout=None)
    guess = parse(_latex(predicted), parsing_timeout=None)
    return bool(gold and guess and verify(gold, guess, timeout_seconds=None))


def exact_equal(predicted: str | None, reference: str) -> bool:
    """Normalised string equality (case, surrounding space, a final period)."""
    return predicted is not None and normalise(predicted) == normalise(reference)


def _shaped(response: str, answer: str, config: RewardConfig, finished: bool, num_tokens: int, match,
            extract=extract_final_answer) -> dict:
    b = score(response, answer, finished, num_tokens, config, extract=extract, match=match)
    return {"reward": b.total, "correct": b.correct, "formatted": b.formatted}


def math_reward(response: str, answer: str, *, config: RewardConfig = RewardConfig(), finished: bool = True,
                num_tokens: int = 0, **info) -> dict:
    """`reward.fn=math`: math-verify equivalence, with the format credit and penalties of `reward.*`."""
    return _shaped(response, answer, config, finished, num_tokens, math_equal)


def exact_reward(response: str, answer: str, *, config: RewardConfig = RewardConfig(), finished: bool = True,
                 num_tokens: int = 0, **info) -> dict:
    """`reward.fn=exact`: the extracted answer must equal the reference as a normalised string."""
    return _shaped(response, answer, config, finished, num_tokens, exact_equal)


def reasoning_gym_reward(response: str, answer: str, *, config: RewardConfig = RewardConfig(), finished: bool = True,
                         num_tokens: int = 0, metadata: dict | None = None, prompt: str = "", **info) -> dict:
    """`reward.fn=reasoning_gym`: the reasoning-gym package's own scorer for the row's generator (from the
    row's `metadata`, which `data.source=reasoning_gym` keeps). The answer is the last `<answer>...</answer>`
    (the package's convention), else what `math` would extract; a score of 1 is correct, and the package's
    score is logged as `reasoning_gym_score`."""
    if not metadata or "source_dataset" not in metadata:
        raise ValueError("reward.fn=reasoning_gym needs data.source=reasoning_gym (the row has no "
                         "metadata.source_dataset)")
    from reasoning_gym import get_score_answer_fn

    scorer = get_score_answer_fn(metadata["source_dataset"])
    entry = {"question": prompt, "answer": answer, "metadata": metadata}
    scores: list[float] = []

    def match(predicted: str | None, _reference: str) -> bool:
        scores.append(0.0 if predicted is None else float(scorer(predicted, entry)))
        return scores[-1] >= 1.0

    out = _shaped(response, answer, config, finished, num_tokens, match, extract=_tagged_answer)
    return {**out, "reasoning_gym_score": scores[-1]}


_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def _tagged_answer(text: str) -> str | None:
    tagged = _ANSWER_TAG.findall(text)
    return tagged[-1].strip() if tagged else extract_final_answer(text)


def ifeval_reward(response: str, answer: str, *, instruction_id_list: list[str] | None = None,
                  kwargs: list[dict] | None = None, prompt: str = "", all_or_nothing: bool = False, **info) -> dict:
    """`reward.fn=ifeval`: the share of the row's instructions the response follows, by IFEval's official checkers
    (strict); `reward.fn=ifeval_all`: 1 only when it follows all of them. Correct means all followed under the loose
    check, IFEval's prompt-level loose accuracy. The row comes from `data.source=ifeval_train` (its
    `instruction_id_list` and `kwargs`). `answer` is unused."""
    if instruction_id_list is None or kwargs is None:
        raise ValueError("reward.fn=ifeval needs rows with instruction_id_list and kwargs (data.source=ifeval_train)")
    from rlinf_like.data.ifeval_checks import check

    verdict = check({"prompt": prompt, "instruction_id_list": instruction_id_list, "kwargs": kwargs}, response)
    share = sum(verdict.strict) / len(verdict.strict)
    # IFEval's four scores, per response; named `ifeval/...` they form a TensorBoard group of their own at evaluation
    # (their means over the held-out greedy answers are the benchmark's scores on that set)
    return {"reward": float(verdict.prompt_strict) if all_or_nothing else share, "correct": verdict.prompt_loose,
            "formatted": verdict.prompt_strict, "ifeval/prompt_strict": float(verdict.prompt_strict),
            "ifeval/prompt_loose": float(verdict.prompt_loose), "ifeval/inst_strict": share,
            "ifeval/inst_loose": sum(verdict.loose) / len(verdict.loose)}


def ifeval_all_reward(response: str, answer: str, **info) -> dict:
    """`reward.fn=ifeval_all`: `ifeval_reward`, all or nothing."""
    info.pop("all_or_nothing", None)
    return ifeval_reward(response, answer, all_or_nothing=True, **info)
