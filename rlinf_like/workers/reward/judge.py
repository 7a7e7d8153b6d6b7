"""LLM-judge rewards (`reward.fn=judge`): a judge model reads each (prompt, response, reference answer) through
a prompt template and its verdict becomes the reward.

The judge is our own engine in a worker group of its own (`judge.model_path`, placed as
`cluster.component_placement.judge`; `judge_worker.py`), or any OpenAI-compatible server (`judge.base_url`,
`judge.model`). A step's judgements go to it together: one engine call when the judge is ours.

Verdicts are parsed by `judge.parser`: `number`, the first number after `judge.marker` divided by
`judge.scale`; or `yes_no`, 1 for yes and 0 for no, where with our own judge and `judge.yes_probability` the score
is the probability the judge gives "yes" against "no" as its next token (no text is generated then). A verdict
that does not parse scores `reward.error_value` and counts in `reward/judge_parse_failed`.

The reward is `judge.weight x judge score + judge.rule_weight x the rule reward` (`judge.rule_fn`, the math
reward by default, whose correctness is also what `correct` and the held-out accuracy report, so judge-only
runs stay comparable with rule-reward runs); `reward/judge_agrees` is the share where the judge's yes (score
>= 0.5) matches the rule's correctness.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Any, Literal

from rlinf_like.config.validate import bounded

DEFAULT_TEMPLATE = ("Question: {prompt}\nReference answer: {answer}\nResponse: {response}\n"
                    "Is the response's final answer equal to the reference answer? Reply yes or no.")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WORD = re.compile(r"[a-z]+")


@dataclass(kw_only=True)
class JudgeConfig:
    model_path: str = ""  # our own judge: an HF checkpoint served by the native engine in the `judge` worker group
    base_url: str = ""  # or any OpenAI-compatible server, e.g. http://host:8000/v1 (with judge.model)
    model: str = ""  # the model name at judge.base_url
    # {prompt}, {response}, {answer} and the data row's columns by name; sent as one user message
    template: str = DEFAULT_TEMPLATE
    parser: Literal["yes_no", "number"] = "yes_no"  # how a verdict becomes a score in [0, 1]
    marker: str = "Score:"  # parser=number: the number after the last occurrence of this text (empty: the last number)
    scale: float = bounded(10.0, gt=0)  # parser=number: the score is the number / scale, clipped to [0, 1]
    # parser=yes_no with our own judge: the score is P(yes) / (P(yes) + P(no)) of the judge's next token
    yes_probability: bool = True
    max_tokens: int = bounded(16, gt=0)  # a generated verdict's length
    timeout_s: float = bounded(120.0, gt=0)  # judge.base_url: one step's requests; past it they score error_value
    weight: float = bounded(1.0, ge=0)  # the judge score's weight in the reward
    rule_weight: float = bounded(0.0, ge=0)  # the rule reward's weight (judge.rule_fn)
    rule_fn: str = "math"  # the rule reward combined with the judge and reported as `correct`


def render(template: str, prompt: str, response: str, answer: str, row: dict[str, Any]) -> str:
    """The judge's user message; a placeholder the template names that the row lacks is refused by name."""
    fields = {**{k: v for k, v in row.items() if isinstance(k, str)}, "prompt": prompt, "response": response,
              "answer": answer}
    try:
        return template.format_map(fields)
    except KeyError as e:
        raise ValueError(f"judge.template names {{{e.args[0]}}}, which is neither prompt, response, answer nor a "
                         f"column of the data row (it has {sorted(k for k in row if isinstance(k, str))})") from e


def template_fields(template: str) -> list[str]:
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def parse_yes_no(text: str) -> float | None:
    """1.0 for a verdict whose first word is yes, 0.0 for no; None otherwise."""
    words = _WORD.findall(text.lower())
    return {"yes": 1.0, "no": 0.0}.get(words[0]) if words else None


def parse_number(text: str, marker: str, scale: float) -> float | None:
    """The first number after the last `marker` (the last number when `marker` is empty), / scale, in [0, 1]."""
    if marker:
        at = text.rfind(marker)
        if at < 0:
            return None
        found = _NUMBER.search(text, at + len(marker))
    else:
        found = (_NUMBER.findall(text) or [None])[-1]
        found = re.match(_NUMBER, found) if found else None
    return None if found is None else min(max(float(found.group(0)) / scale, 0.0), 1.0)


def parse(cfg: JudgeConfig, text: str) -> float | None:
    return parse_yes_no(text) if cfg.parser == "yes_no" else parse_number(text, cfg.marker, cfg.scale)


def judge_reward(response: str, answer: str, *, config, judge: JudgeConfig, judge_score: float | None = None,
                 **info) -> dict:
    """`reward.fn=judge`: the judge's score (`judge_score`, None when its verdict did not parse) weighted with the
    rule reward `judge.rule_fn`, whose correctness is the sample's `correct`."""
    from rlinf_like.workers.reward.fn import REWARD_FNS

    rule = REWARD_FNS.get(judge.rule_fn)(response, answer, config=config, **info)
    rule = rule if isinstance(rule, dict) else {"reward": float(rule), "correct": float(rule) >= config.correct}
    parsed = judge_score is not None
    score = judge_score if parsed else config.error_value
    out = {"reward": judge.weight * score + judge.rule_weight * rule["reward"], "correct": bool(rule["correct"]),
           "formatted": bool(rule.get("formatted", rule["correct"])), "rule_reward": float(rule["reward"]),
           "judge_score": float(score), "judge_parse_failed": 0.0 if parsed else 1.0}
    if parsed:
        out["judge_agrees"] = float((score >= 0.5) == bool(rule["correct"]))
    return out


judge_reward.needs_judge = True  # the runner launches the judge (`judge_worker.py`) and passes each verdict
