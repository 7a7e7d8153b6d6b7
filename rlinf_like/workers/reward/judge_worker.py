"""The judge's worker group (`reward.fn=judge`): it decodes each sample as the reward worker does, renders the
judge's prompt and scores it with the judge, all of a step's samples together.

Our own judge (`judge.model_path`) is the native engine: one `generate` call per step for text verdicts, or, for
`judge.parser=yes_no` with `judge.yes_probability`, one forward whose next-token distribution gives P(yes) /
(P(yes) + P(no)). A remote judge (`judge.base_url`) gets one chat request per sample, all at once; a failed or
late one is logged with its request id and scores `reward.error_value`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait

import torch

from rlinf_like.models import load_tokenizer
from rlinf_like.runtime import Worker
from rlinf_like.workers.reward.judge import JudgeConfig, parse, render
from rlinf_like.workers.reward.worker import sample_text
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult, SamplingParams

log = logging.getLogger(__name__)
YES, NO = ("yes", "Yes", " yes", " Yes", "YES"), ("no", "No", " no", " No", "NO")


class JudgeWorker(Worker):
    def __init__(self, policy_tokenizer_path: str, config: JudgeConfig, max_context: int = 2048):
        self.tokenizer, self.config, self.max_context = load_tokenizer(policy_tokenizer_path), config, max_context
        self.calls = 0  # engine calls (generate or forward) since start
        self._engine = self._model = None
        self.judge_tokenizer = load_tokenizer(config.model_path, "judge.model_path") if config.model_path else None

    def engine_calls(self) -> int:
        return self.calls

    def judge(self, results: Sequence[RolloutResult], answers: Sequence[str],
              rows: Sequence[dict]) -> list[list[float | None]]:
        """Per request, per sample: the judge's score in [0, 1], or None where its verdict did not parse."""
        texts, ids, shape = [], [], []
        for result, answer, row in zip(results, answers, rows):
            prompt = self.tokenizer.decode(result.prompt_ids, skip_special_tokens=True)
            for j in range(len(result.response_ids)):
                texts.append(render(self.config.template, prompt, sample_text(self.tokenizer, result, j), answer, row))
                ids.append(f"{result.request_id}/{j}")
            shape.append(len(result.response_ids))
        scores = self._remote(texts, ids) if self.config.base_url else self._local(texts)
        out, at = [], 0
        for n in shape:
            out.append(scores[at : at + n])
            at += n
        return out

    # --- our own judge ---------------------------------------------------------------------------------------
    def _prompt_ids(self, text: str) -> list[int]:
        """The prompt as one user message through the judge's chat template; a judge without one (a base model)
        reads the text as it is."""
        if not getattr(self.judge_tokenizer, "chat_template", None):
            return list(self.judge_tokenizer(text).input_ids)
        return list(self.judge_tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                             add_generation_prompt=True, return_dict=False))

    def _local(self, texts: list[str]) -> list[float | None]:
        if not texts:
            return []
        self.calls += 1
        if self.config.parser == "yes_no" and self.config.yes_probability:
            return self._yes_probability([self._prompt_ids(t) for t in texts])
        if self._engine is None:
            from rlinf_like.workers.rollout import RolloutConfig, make_engine

            self._engine = make_engine(RolloutConfig(engine="native", model_path=self.config.model_path,
                                                     max_context=self.max_context), tokenizer=self.judge_tokenizer)
        params = SamplingParams(max_new_tokens=self.config.max_tokens, temperature=0.0)
        results = self._engine.generate([RolloutRequest(f"judge-{i}", self._prompt_ids(t), params, 1)
                                         for i, t in enumerate(texts)])
        return [parse(self.config, self.judge_tokenizer.decode(r.response_ids[0], skip_special_tokens=True))
                for r in results]

    @torch.inference_mode()
    def _yes_probability(self, prompts: list[list[int]]) -> list[float | None]:
        if self._model is None:
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(self.config.model_path, dtype=torch.float32).eval()
        width, pad = max(len(p) for p in prompts), self.judge_tokenizer.pad_token_id or 0
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])  # left-padded: the last position is next
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        logp = torch.log_softmax(self._model(input_ids=ids, attention_mask=mask).logits[:, -1].float(), dim=-1)
        yes, no = (self._token_ids(words) for words in (YES, NO))
        if not yes or not no:
            raise ValueError(f"judge.yes_probability: the judge's vocabulary ({self.config.model_path}) has no single "
                             f"token for yes / no; set judge.yes_probability=false to parse generated text")
        p_yes, p_no = logp[:, yes].exp().sum(-1), logp[:, no].exp().sum(-1)
        return [float(y / (y + n)) for y, n in zip(p_yes, p_no)]

    def _token_ids(self, words: Sequence[str]) -> list[int]:
        """The words that are one token of the judge's vocabulary."""
        ids = {tuple(self.judge_tokenizer(w, add_special_tokens=False).input_ids) for w in words}
        return sorted({i[0] for i in ids if len(i) == 1})

    # --- a remote judge --------------------------------------------------------------------------------------
    def _remote(self, texts: list[str], ids: list[str]) -> list[float | None]:
        import openai

        client = openai.OpenAI(base_url=self.config.base_url, api_key="EMPTY", max_retries=0,
                               timeout=self.config.timeout_s)

        def ask(text: str) -> str:
            reply = client.chat.completions.create(model=self.config.model, temperature=0.0,
                                                   max_tokens=self.config.max_tokens,
                                                   messages=[{"role": "user", "content": text}])
            return reply.choices[0].message.content or ""

        self.calls += 1
        with ThreadPoolExecutor(max(1, min(64, len(texts)))) as pool:
            futures = [pool.submit(ask, t) for t in texts]
            wait(futures, timeout=self.config.timeout_s)
            scores = []
            for request_id, future in zip(ids, futures):
                if not future.done() or future.exception() is not None:
                    why = "timed out" if not future.done() else f"{type(future.exception()).__name__}: {future.exception()}"
                    log.warning("judge at %s, request %s: %s; the sample scores reward.error_value",
                                self.config.base_url, request_id, why)
                    scores.append(None)
                    continue
                scores.append(parse(self.config, future.result()))
            return scores
