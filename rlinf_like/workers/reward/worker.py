"""RewardWorker: scores rollout results against reference answers with the reward function
(`reward.fn`, see `fn.py`), a learned reward model, or both (`reward.kind`, see `combine.py`)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace

import torch

from rlinf_like.models import load_tokenizer
from rlinf_like.runtime import Worker
from rlinf_like.workers.reward.combine import REWARD_KINDS, check_reward_config, combine_rewards
from rlinf_like.workers.reward.fn import load_reward_fn, needs_judge, score_sample
from rlinf_like.workers.reward.judge import JudgeConfig
from rlinf_like.workers.reward.rules import RewardConfig
from rlinf_like.workers.reward.types import SampleScore
from rlinf_like.workers.rollout.types import RolloutResult


# row columns that cannot be keyword arguments: the positional parameters, and built-ins' `config`
RESERVED = ("response", "answer", "config")


def reward_info(row: dict, prompt: str, finished: bool, num_tokens: int) -> dict:
    """The keyword arguments of one reward call: the row's columns, then the documented keys, which win
    over same-named columns; columns named as in `RESERVED` are left out."""
    return {**{k: v for k, v in row.items() if k not in RESERVED}, "prompt": prompt, "finished": finished,
            "num_tokens": num_tokens}


def final_turn(tokens: Sequence[int], mask: Sequence[int]) -> list[int]:
    """The model's last turn of a multi-turn response: the tokens after the last one it did not write."""
    last_env = max((t for t, m in enumerate(mask) if not m), default=-1)
    return list(tokens[last_env + 1 :])


def sample_text(tokenizer, result: RolloutResult, j: int) -> str:
    """Sample `j`'s text as a reward (or a judge) reads it: a multi-turn sample's last model turn only."""
    tokens = result.response_ids[j]
    final = final_turn(tokens, result.response_masks[j]) if result.response_masks else tokens
    return tokenizer.decode(final, skip_special_tokens=True)


class RewardWorker(Worker):
    def __init__(self, tokenizer_path: str, config: RewardConfig = RewardConfig(), judge: JudgeConfig | None = None):
        check_reward_config(config)
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.config = config
        self.reward_fn = load_reward_fn(config)  # a user's `module:function` is imported here, in the worker
        if needs_judge(config.fn):  # the judge section's weights; each sample's verdict arrives with `score`
            self.reward_fn = functools.partial(self.reward_fn, judge=judge or JudgeConfig())
        self.model = None
        if REWARD_KINDS.get(config.kind).uses_model:
            from rlinf_like.workers.reward.model import RewardModel

            self.model = RewardModel(config.model_path, config.model_micro_batch_size, self.torch_device)

    def score(self, results: Sequence[RolloutResult], answers: Sequence[str],
              row_extras: Sequence[dict] | None = None,
              judged: Sequence[Sequence[float | None]] | None = None) -> list[list[SampleScore]]:
        """Per request, per sample: its `SampleScore`. `row_extras`: per request, the data row's other
        columns, passed to the reward function as keyword arguments; `judged`: per request, per sample, the
        judge's score (`reward.fn=judge`), passed as `judge_score`."""
        samples, rows, finished, lengths = [], [], [], []
        for i, (result, answer) in enumerate(zip(results, answers)):
            prompt = self.tokenizer.decode(result.prompt_ids, skip_special_tokens=True)
            row = row_extras[i] if row_extras else {}
            for j, (tokens, reason) in enumerate(zip(result.response_ids, result.finish_reasons)):
                # a multi-turn sample is judged by the model's last turn, plus what its environment awarded
                text = sample_text(self.tokenizer, result, j)
                info = reward_info(row, prompt, reason == "stop", len(tokens))
                if judged is not None:
                    info["judge_score"] = judged[i][j]
                episode = result.episodes[j] if result.episodes else None
                if episode is not None and episode.program_reward is not None:  # an agent program scored itself
                    sample = SampleScore(reward=episode.program_reward, correct=episode.program_reward >= 1.0,
                                         formatted=episode.program_formatted)
                else:
                    sample = score_sample(self.reward_fn, self.config, result.request_id, text, answer, **info)
                if episode is not None and episode.env_reward:
                    sample = replace(sample, reward=sample.reward + episode.env_reward)
                samples.append(sample)
                rows.append(list(result.prompt_ids) + list(tokens))
                finished.append(reason == "stop")
                lengths.append(len(tokens))
        if self.model is not None or self.config.whiten:
            rule = torch.tensor([s.reward for s in samples])
            model = self.model.score(rows) if self.model is not None else None
            total, penalised = combine_rewards(self.config, rule, model, torch.tensor(finished, dtype=torch.bool),
                                               torch.tensor(lengths))
            samples = [replace(s, rule_reward=s.reward, reward=float(total[i]),
                               model_score=None if penalised is None else float(penalised[i]))
                       for i, s in enumerate(samples)]
        out, i = [], 0
        for result in results:
            out.append(samples[i : i + len(result.response_ids)])
            i += len(result.response_ids)
        return out
