"""The reference engine: transformers' `generate`, as plainly as possible.

Requests with the same sampling parameters run as one left-padded batch (each prompt repeated
n times). Logprobs come from the raw logits `generate` returns, so they mean the same as the
native engine's. It exists to check the other engines against; it does not stream, continue batching,
or shard. (`bench/rollout.py` calls `generate` itself, without returning logits, as a user after speed would.)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import torch

from rlinf_like.hybrid_engines.reshard import TensorLayout, replicated
from rlinf_like.hybrid_engines.residency import ResidencyManager
from rlinf_like.models import load_tokenizer
from rlinf_like.workers.rollout.base import ResultCallback, RolloutConfig, RolloutEngine
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult, SamplingParams, rejected, request_error


class HFEngine(RolloutEngine):
    # one rank, no continuation of migrated requests, sampled logprobs only: the base's declarations

    @classmethod
    def create(cls, config: RolloutConfig, process_group=None, tokenizer=None, device: str = "cpu") -> HFEngine:
        return cls(config, tokenizer=tokenizer, device=device)  # no process group: supports_tp is False

    def __init__(self, config: RolloutConfig, tokenizer=None, device: str = "cpu"):
        from transformers import AutoModelForCausalLM

        super().__init__()
        self.config = config
        self.model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=getattr(torch, config.dtype))
        self.model.to(device).eval()
        self.device = torch.device(device)
        self.max_context = config.max_context or self.model.config.max_position_embeddings
        self.tokenizer = tokenizer or load_tokenizer(config.model_path)
        eos = self.model.generation_config.eos_token_id
        self.eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._residency = ResidencyManager(self.model)

    def weight_layouts(self) -> list[TensorLayout]:
        return [replicated(n, tuple(t.shape), 1, str(t.dtype)) for n, t in self.model.state_dict().items()]

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()  # tensors that share storage with the parameters

    def offload(self) -> None:
        self._residency.offload(["params"])

    def onload(self) -> None:
        self._residency.onload(["params"])

    def generate(self, requests: Sequence[RolloutRequest], on_result: ResultCallback | None = None) -> list[RolloutResult]:
        self._abort.clear()  # an abort that came after the last generate ended must not stop this one
        results: list[RolloutResult | None] = [None] * len(requests)
        batches: dict[SamplingParams, list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            error = request_error(request, self.max_context, 1 << 30)
            if error is None and request.progress:
                error = f"request {request.request_id!r}: rollout.engine=hf cannot continue a migrated request"
            if error is not None:
                results[i] = rejected(request, error, self.version)
            else:
                batches[request.sampling].append(i)
        for params, indices in batches.items():
            for i, result in zip(indices, self._generate_batch([requests[i] for i in indices], params)):
                results[i] = result
        for result in results:
            if on_result is not None:
                on_result(result)
        return results

    @torch.inference_mode()
    def _generate_batch(self, requests: list[RolloutRequest], params: SamplingParams) -> list[RolloutResult]:
        prompts = [r.prompt_ids for r in requests for _ in range(r.n)]
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_id] * (width - len(p)) + p for p in prompts], device=self.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        stop_ids = list(params.stop_token_ids) + ([] if params.ignore_eos else list(self.eos_ids))
        if params.seed is not None:
            torch.manual_seed(params.seed)
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=min(params.max_new_tokens, self.max_context - width),
            do_sample=not params.greedy, temperature=params.temperature if not params.greedy else None,
            top_k=params.top_k if params.top_k > 0 else None, top_p=params.top_p if not params.greedy else None,
            eos_token_id=stop_ids or None, pad_token_id=self.pad_id,
            stop_strings=list(params.stop_strings) or None, tokenizer=self.tokenizer if params.stop_strings else None,
            output_logits=True, return_dict_in_generate=True,
        )
        temperature = 1.0 if params.greedy else params.temperature
        new_tokens = out.sequences[:, width:]
        logprobs = torch.stack(out.logits, dim=1).float().div(temperature).log_softmax(-1)
        logprobs = logprobs.gather(-1, new_tokens[..., None])[..., 0]
        results, row = [], 0
        for request in requests:
            result = RolloutResult(request.request_id, list(request.prompt_ids), version=self.version)
            for _ in range(request.n):
                tokens, reason = self._trim(new_tokens[row].tolist(), params, stop_ids)
                result.response_ids.append(tokens)
                result.logprobs.append(logprobs[row, : len(tokens)].tolist())
                result.finish_reasons.append(reason)
                row += 1
            results.append(result)
        return results

    def _trim(self, tokens: list[int], params: SamplingParams, stop_ids: list[int]) -> tuple[list[int], str]:
        """Cut the padding after a sequence finished; keep the stop token / string, like the native engine."""
        for t, token in enumerate(tokens):
            if token in stop_ids:
                return tokens[: t + 1], "stop"
            if params.stop_strings:
                tail = self.tokenizer.decode(tokens[max(0, t + 1 - max(map(len, params.stop_strings))) : t + 1])
                if any(s in tail for s in params.stop_strings):
                    return tokens[: t + 1], "stop"
        return tokens, "length"
