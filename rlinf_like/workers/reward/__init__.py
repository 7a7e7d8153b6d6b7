"""Rewards: reward functions by name (`reward.fn`, see fn.py), the rule-based shaping they share
(answer extraction, comparison, format, penalties), and learned reward models."""

from rlinf_like.workers.reward.fn import REWARD_FNS, load_reward_fn
from rlinf_like.workers.reward.rules import RewardBreakdown, RewardConfig, answers_match, extract_answer, score

__all__ = ["REWARD_FNS", "RewardBreakdown", "RewardConfig", "answers_match", "extract_answer", "load_reward_fn",
           "score"]
