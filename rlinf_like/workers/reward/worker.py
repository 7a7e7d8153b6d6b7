"""RewardWorker: scores rollout results against reference answers with the rule-based rewards."""

from __future__ import annotations

from collections.abc import Sequence

from rlinf_like.models import load_tokenizer
from rlinf_like.scheduler import Worker
from rlinf_like.workers.reward.rules import RewardConfig, score
from rlinf_like.workers.rollout.types import RolloutResult


class RewardWorker(Worker):
    def __init__(self, tokenizer_path: str, config: RewardConfig = RewardConfig()):
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.config = config

    def score(self, results: Sequence[RolloutResult], answers: Sequence[str]) -> list[list[dict]]:
        """Per request, per sample: {"reward", "correct", "formatted"}."""
        out = []
        for result, answer in zip(results, answers):
            group = []
            for tokens, reason in zip(result.response_ids, result.finish_reasons):
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                b = score(text, answer, finished=reason == "stop", num_tokens=len(tokens), config=self.config)
                group.append({"reward": b.total, "correct": b.correct, "formatted": b.formatted})
            out.append(group)
        return out
