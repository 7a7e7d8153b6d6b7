"""The embedded engine: continuous batching over a preallocated KV cache, optionally tensor parallel.

`max_batch_size` cache slots hold sequences being decoded. A request (its n samples) is admitted
as soon as n slots are free: its prompt is prefilled once and its keys/values written into all n
slots, so a GRPO group shares one prefill. Every step decodes one token for all busy slots
together; a finished sequence frees its slot at once, and the next request takes it while the
others keep decoding. The cache is allocated once and reused across calls; decode attends only
up to the longest live sequence.

Under tensor parallelism every rank runs this same loop on the same requests (the worker group
fans the call out); sampling is a pure function of each sequence's seed (see `sampling.py`), so
all ranks pick the same tokens with no broadcast. Only an abort needs agreement: one small
all-reduce per step.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from rlinf_like.hybrid_engines.reshard import TensorLayout
from rlinf_like.hybrid_engines.residency import ResidencyManager
from rlinf_like.workers.rollout.base import ResultCallback, RolloutConfig, RolloutEngine
from rlinf_like.workers.rollout.native.model import (
    Decoder,
    fuse_projections,
    load_shards,
    model_config,
    weight_layouts,
)
from rlinf_like.workers.rollout.sampling import RowParams, sample
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult, rejected, request_error


class _TensorBag(nn.Module):
    """Named tensors as module buffers, so the residency manager can move them in place."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        super().__init__()
        for i, tensor in enumerate(tensors.values()):
            self.register_buffer(f"t{i}", tensor)


@dataclass
class _Live:
    """One sample being decoded in a cache slot."""

    request: int  # index into the generate() call's requests
    sample: int
    prompt_len: int
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    max_new: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class NativeEngine(RolloutEngine):
    supports_tp = True
    continues_migrated = True
    rescored_logprobs = True

    def __init__(self, config: RolloutConfig, process_group=None, tokenizer=None, device: str = "cpu"):
        super().__init__()
        self.config = config
        self.model_cfg = model_config(config.model_path)
        self.dtype = getattr(torch, config.dtype)
        self.device = torch.device(device)
        tp = dist.get_world_size(process_group) if process_group is not None else 1
        self.tp_group = process_group if tp > 1 else None
        self.rank = dist.get_rank(process_group) if self.tp_group is not None else 0
        self.layouts = weight_layouts(self.model_cfg, tp, self.dtype)
        shards = load_shards(config.model_path, self.layouts, self.rank, self.dtype)
        fused = fuse_projections(self.model_cfg, {n: t.to(self.device) for n, t in shards.items()})
        self.weights = {layout.name: fused[layout.name] for layout in self.layouts}  # HF names (some are views)
        self.decoder = Decoder(self.model_cfg, fused, self.tp_group)
        self.max_context = config.max_context or self.model_cfg.max_position_embeddings
        self.slots = config.max_batch_size
        self._tokenizer = tokenizer
        self._residency = ResidencyManager(_TensorBag(self.weights))
        self._rng = random.Random(config.seed)  # same on every TP rank, consumed in the same order

    # --- weights / memory ------------------------------------------------------------------------------
    def weight_layouts(self) -> list[TensorLayout]:
        return self.layouts

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        return self.weights

    def offload(self) -> None:
        self._residency.offload(["params"])
        self.decoder.free_cache()

    def onload(self) -> None:
        self._residency.onload(["params"])

    # --- serving -----------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[RolloutRequest], on_result: ResultCallback | None = None) -> list[RolloutResult]:
        self._abort.clear()  # an abort that came after the last generate ended must not stop this one
        if self._residency.is_offloaded("params"):
            raise RuntimeError("native engine: generate() while offloaded; call onload() first")
        results: list[RolloutResult] = []
        queue: deque[int] = deque()
        for i, request in enumerate(requests):
            error = request_error(request, self.max_context, self.slots)
            if error is not None:
                results.append(rejected(request, error, self.version))
                if on_result is not None:
                    on_result(results[-1])
                continue
            n = request.n
            results.append(RolloutResult(request.request_id, list(request.prompt_ids), [[] for _ in range(n)],
                                         [[] for _ in range(n)], [""] * n, self.version))
            for j, progress in enumerate(request.progress):
                if progress.done:  # finished where it started: kept as it is
                    results[-1].response_ids[j], results[-1].logprobs[j] = list(progress.tokens), list(progress.logprobs)
                    results[-1].finish_reasons[j] = progress.finish_reason
            if request.unfinished():
                queue.append(i)
            elif on_result is not None:
                on_result(results[-1])
        if queue:
            self._run(requests, results, queue, on_result)
        return results

    def _run(self, requests, results, queue: deque[int], on_result: ResultCallback | None) -> None:
        if self.decoder.k_cache is None:
            self.decoder.allocate_cache(self.slots, self.max_context, self.dtype, self.device)
        free = list(range(self.slots))  # a min-heap: low slots first keeps the decoded range short
        live: dict[int, _Live] = {}
        remaining = {i: len(requests[i].unfinished()) for i in queue}
        state = _SlotState(self.slots, self.device)

        def finish(slot: int | None, seq: _Live, reason: str) -> None:
            if self.config.logprobs == "rescored" and reason != "abort":
                seq.logprobs = self._rescore(requests[seq.request], seq.tokens)
            result = results[seq.request]
            result.response_ids[seq.sample], result.logprobs[seq.sample] = seq.tokens, seq.logprobs
            result.finish_reasons[seq.sample] = reason
            if slot is not None:
                del live[slot]
                state.release(slot)
                heapq.heappush(free, slot)
            remaining[seq.request] -= 1
            if remaining[seq.request] == 0 and on_result is not None:
                on_result(result)

        def record(slot: int, seq: _Live, token: int, logprob: float) -> None:
            seq.tokens.append(token)
            seq.logprobs.append(logprob)
            reason = self._finish_reason(seq, token)
            if reason is not None:
                finish(slot, seq, reason)

        while queue or live:
            if self._agree_abort():
                for slot, seq in list(live.items()):
                    finish(slot, seq, "abort")
                for i in queue:  # never started: aborted with the progress they came with
                    for j in requests[i].unfinished():
                        finish(None, self._new_sequence(i, j, requests[i]), "abort")
                return
            while queue and len(free) >= len(requests[queue[0]].unfinished()):
                i = queue.popleft()
                request = requests[i]
                todo = request.unfinished()
                slots = [heapq.heappop(free) for _ in todo]
                state.admit(slots, request, [self._seed(request, j) for j in todo])
                seqs = [self._new_sequence(i, j, request) for j in todo]
                if request.progress:  # migrated: each sample resumes from its own tokens
                    for slot, seq in zip(slots, seqs):
                        live[slot] = seq
                        first = self._resume(slot, seq, request, state)
                        if first is not None:
                            record(slot, seq, *first)
                    continue
                logits = self.decoder.prefill(torch.tensor(request.prompt_ids, device=self.device),
                                              torch.tensor(slots, device=self.device))
                tokens, logprobs = sample(logits.expand(len(slots), -1), state.params(slots))
                state.after_prefill(slots, tokens, len(request.prompt_ids))
                for slot, seq, token, logprob in zip(slots, seqs, tokens.tolist(), logprobs.tolist()):
                    live[slot] = seq
                    record(slot, seq, token, logprob)
            if not live:
                continue
            span = max(live) + 1
            logits = self.decoder.decode(state.last_token[:span], state.position[:span])
            tokens, logprobs = sample(logits, state.params(slice(0, span)))
            state.after_decode(span, tokens)
            for slot, token, logprob in zip(range(span), tokens.tolist(), logprobs.tolist()):
                seq = live.get(slot)
                if seq is not None:
                    record(slot, seq, token, logprob)

    def _new_sequence(self, index: int, sample_index: int, request: RolloutRequest) -> _Live:
        s = request.sampling
        stop_ids = set(s.stop_token_ids) | (set() if s.ignore_eos else set(self.model_cfg.eos_token_ids))
        progress = request.progress[sample_index] if request.progress else None
        return _Live(index, sample_index, len(request.prompt_ids), frozenset(stop_ids), tuple(s.stop_strings),
                     s.max_new_tokens, list(progress.tokens) if progress else [],
                     list(progress.logprobs) if progress else [])

    def _resume(self, slot: int, seq: _Live, request: RolloutRequest, state: _SlotState) -> tuple[int, float] | None:
        """Put a migrated sample where its first engine left it: the prompt and all but its last token in
        the cache, the last token next to decode, the sampling step at its token count (so it draws the
        noise it would have drawn). A sample that had not started is prefilled; its first (token, logprob)
        is returned for the caller to record."""
        done = seq.tokens
        prefix = torch.tensor(list(request.prompt_ids) + done[:-1], device=self.device)
        logits = self.decoder.prefill(prefix, torch.tensor([slot], device=self.device))
        if done:
            state.resume(slot, done[-1], len(prefix), len(done))
            return None
        token, logprob = sample(logits[None], state.params([slot]))
        state.after_prefill([slot], token, len(prefix))
        return int(token[0]), float(logprob[0])

    def _rescore(self, request: RolloutRequest, tokens: list[int]) -> list[float]:
        """Logprobs of `tokens` from one pass over prompt + tokens alone (`rollout.logprobs=rescored`):
        the same floats whichever batch or replica sampled them, which decode-time logprobs are not."""
        ids = torch.tensor(list(request.prompt_ids) + tokens, device=self.device)
        logits = self.decoder.score(ids)[len(request.prompt_ids) - 1 : -1]
        s = request.sampling
        scaled = logits / (1.0 if s.greedy else s.temperature)
        chosen = torch.tensor(tokens, device=self.device)[:, None]
        return torch.log_softmax(scaled, dim=-1).gather(-1, chosen)[:, 0].tolist()

    def _seed(self, request: RolloutRequest, sample_index: int) -> int:
        if request.sampling.seed is None:
            return self._rng.getrandbits(62)
        return (request.sampling.seed * 1_000_003 + sample_index) % (1 << 62)

    def _finish_reason(self, seq: _Live, token: int) -> str | None:
        if token in seq.stop_ids:
            return "stop"
        if seq.stop_strings:
            tail = self.tokenizer.decode(seq.tokens[-max(len(s) for s in seq.stop_strings):])
            if any(s in tail for s in seq.stop_strings):
                return "stop"
        if len(seq.tokens) >= seq.max_new or seq.prompt_len + len(seq.tokens) >= self.max_context:
            return "length"
        return None

    def _agree_abort(self) -> bool:
        flag = self._abort.is_set()
        if self.tp_group is None:
            return flag
        votes = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self.tp_group)
        return bool(votes[0])

    @property
    def tokenizer(self):
        if self._tokenizer is None:  # only stop strings need it
            from rlinf_like.models import load_tokenizer

            self._tokenizer = load_tokenizer(self.config.model_path)
        return self._tokenizer


class _SlotState:
    """Per-slot decode inputs and sampling parameters as tensors, updated in place each step."""

    def __init__(self, slots: int, device: torch.device):
        self.last_token = torch.zeros(slots, dtype=torch.int64, device=device)
        self.position = torch.zeros(slots, dtype=torch.int64, device=device)
        self.active = torch.zeros(slots, dtype=torch.bool, device=device)
        self.temperature = torch.zeros(slots, device=device)
        self.top_k = torch.zeros(slots, dtype=torch.int64, device=device)
        self.top_p = torch.ones(slots, device=device)
        self.seed = torch.zeros(slots, dtype=torch.int64, device=device)
        self.step = torch.zeros(slots, dtype=torch.int64, device=device)

    def admit(self, slots: list[int], request: RolloutRequest, seeds: list[int]) -> None:
        s = request.sampling
        index = torch.tensor(slots, device=self.seed.device)
        self.temperature[index] = s.temperature
        self.top_k[index] = s.top_k
        self.top_p[index] = s.top_p
        self.seed[index] = torch.tensor(seeds, device=self.seed.device)
        self.step[index] = 0
        self.active[index] = True

    def params(self, rows) -> RowParams:
        return RowParams(self.temperature[rows], self.top_k[rows], self.top_p[rows], self.seed[rows], self.step[rows])

    def resume(self, slot: int, last_token: int, position: int, step: int) -> None:
        self.last_token[slot], self.position[slot], self.step[slot] = last_token, position, step

    def after_prefill(self, slots: list[int], tokens: torch.Tensor, prompt_len: int) -> None:
        index = torch.tensor(slots, device=tokens.device)
        self.last_token[index] = tokens
        self.position[index] = prompt_len  # the first sampled token goes into the cache here
        self.step[index] = 1

    def after_decode(self, span: int, tokens: torch.Tensor) -> None:
        active = self.active[:span].long()
        self.last_token[:span] = tokens * active
        self.position[:span] += active
        self.step[:span] += active

    def release(self, slot: int) -> None:
        # Idle slots still ride along in the decoded range: token 0 at position 0 of their own
        # (unused) cache rows, harmless, and never past the cache's end.
        self.active[slot] = False
        self.position[slot] = 0
        self.last_token[slot] = 0
