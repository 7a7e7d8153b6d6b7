"""RewardWorker: scores rollout results against reference answers with the rule-based rewards, a
learned reward model, or both (`reward.kind`, see `combine.py`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlinf_like.models import load_tokenizer
from rlinf_like.scheduler import Worker
from rlinf_like.workers.reward.combine import check_reward_config, combine_rewards
from rlinf_like.workers.reward.rules import RewardConfig, score
from rlinf_like.workers.rollout.types import RolloutResult


class RewardWorker(Worker):
    def __init__(self, tokenizer_path: str, config: RewardConfig = RewardConfig()):
        check_reward_config(config)
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.config = config
        self.model = None
        if config.kind != "rule":
            from rlinf_like.workers.reward.model import RewardModel

            self.model = RewardModel(config.model_path, config.model_micro_batch_size, self.torch_device)

    def score(self, results: Sequence[RolloutResult], answers: Sequence[str]) -> list[list[dict]]:
        """Per request, per sample: {"reward", "correct", "formatted"} (+ "rule_reward", "model_score"
        with a reward model)."""
        samples, rows = [], []
        for result, answer in zip(results, answers):
            for tokens, reason in zip(result.response_ids, result.finish_reasons):
                text = self.tokenizer.decode(tokens, skip_special_tokens=True)
                b = score(text, answer, finished=reason == "stop", num_tokens=len(tokens), config=self.config)
                samples.append({"reward": b.total, "correct": b.correct, "formatted": b.formatted,
                                "finished": reason == "stop", "tokens": len(tokens)})
                rows.append(list(result.prompt_ids) + list(tokens))
        if self.config.kind != "rule" or self.config.whiten:
            rule = torch.tensor([s["reward"] for s in samples])
            scores = self.model.score(rows) if self.model is not None else None
            total, penalised = combine_rewards(self.config, rule, scores,
                                               torch.tensor([s["finished"] for s in samples], dtype=torch.bool),
                                               torch.tensor([s["tokens"] for s in samples]))
            for i, s in enumerate(samples):
                s["rule_reward"], s["reward"] = s["reward"], float(total[i])
                if penalised is not None:
                    s["model_score"] = float(penalised[i])
        out, i = [], 0
        for result in results:
            group = samples[i : i + len(result.response_ids)]
            for s in group:
                del s["finished"], s["tokens"]
            out.append(group)
            i += len(group)
        return out
