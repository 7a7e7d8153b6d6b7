"""Rule-based verifiable rewards (answer extraction, numeric comparison, format, penalties)."""

from rlinf_like.workers.reward.rules import RewardBreakdown, RewardConfig, answers_match, extract_answer, score

__all__ = ["RewardBreakdown", "RewardConfig", "answers_match", "extract_answer", "score"]
