"""What the reward worker returns for one sample: a typed record, the same across processes."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, kw_only=True)
class SampleScore:
    reward: float  # what training uses: the rule reward, or rule and reward model combined (reward.kind)
    correct: bool  # the answer matches the reference
    formatted: bool  # an answer was found where the format asks for it
    rule_reward: float | None = None  # with a reward model: the rule reward before combining
    model_score: float | None = None  # with a reward model: its (penalised) score
    extras: dict[str, float] = field(default_factory=dict)  # a reward dict's other numbers, logged as metrics
