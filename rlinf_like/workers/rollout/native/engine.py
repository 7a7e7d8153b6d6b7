"""The embedded engine: continuous batching over a paged KV cache, optionally tensor parallel.

`max_batch_size` batch slots hold sequences being decoded; their keys and values live in the
paged cache (`paging.py`): blocks of `rollout.kv_block_size` tokens, as many as the memory budget
holds, each sequence taking a block when it grows into one (its block table maps positions to
blocks). A request (its n samples) is admitted when n slots are free and the blocks its prompt
fills are free, plus one block of headroom per sample: its prompt is prefilled once, the blocks
the prompt fills whole are shared by the n samples and the last, partial one copied into each, so
a GRPO group shares one prefill and most of its prompt's memory. Every step decodes one token for
all busy slots together; a finished sequence frees its slot and blocks at once, and the next
request takes them while the others keep decoding. The cache is allocated once (at the first
generate after start-up or an onload) and reused; decode gathers each sequence's blocks only up
to the longest live sequence.

When a step needs more new blocks than are free, the engine **preempts** the most recently
admitted sequences (frees their slots and blocks) until the rest fit, and re-admits them before
any new request once blocks are free again, recomputing their keys/values from prompt + tokens in
one prefill (vLLM's recompute preemption). A preempted sample continues with the noise it would
have drawn (the sampler is counter-based), so sampled tokens follow the same draws; the recomputed
keys/values may differ from the decoded ones in the last bits. The start-up check guarantees that
one sequence of `max_context` tokens fits, so the oldest sequence always makes progress.

Under tensor parallelism every rank runs this same loop on the same requests (the worker group
fans the call out); sampling is a pure function of each sequence's seed (see `sampling.py`), so
all ranks pick the same tokens with no broadcast. Only an abort needs agreement: one small
all-reduce per step.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from rlinf_like.hybrid_engines.reshard import TensorLayout
from rlinf_like.hybrid_engines.residency import ResidencyManager
from rlinf_like.workers.rollout.base import RequestSource, ResultCallback, RolloutConfig, RolloutEngine
from rlinf_like.workers.rollout.native.model import (
    Decoder,
    fuse_projections,
    kv_bytes_per_token,
    load_shards,
    model_config,
    weight_layouts,
)
from rlinf_like.workers.rollout.native.paging import BlockPool, cache_budget, plan_cache
from rlinf_like.workers.rollout.sampling import RowParams, sample
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult, rejected, request_error

log = logging.getLogger(__name__)


class _TensorBag(nn.Module):
    """Named tensors as module buffers, so the residency manager can move them in place."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        super().__init__()
        for i, tensor in enumerate(tensors.values()):
            self.register_buffer(f"t{i}", tensor)


@dataclass
class _Live:
    """One sample being decoded in a batch slot (or waiting to be resumed)."""

    request: int  # index into the generate() call's requests
    sample: int
    prompt_len: int
    stop_ids: frozenset[int]
    stop_strings: tuple[str, ...]
    max_new: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    seed: int = 0  # its sampling seed, kept across a preemption
    order: int = 0  # admission order: the newest is preempted first, the oldest resumed first
    blocks: list[int] = field(default_factory=list)  # its block table: cache blocks by position // block size
    versions: list[int] = field(default_factory=list)  # the weight version each token was sampled under

    @property
    def position(self) -> int:
        """Where its next decode step writes: prompt + tokens, less the last token (not yet in the cache)."""
        return self.prompt_len + len(self.tokens) - 1


class NativeEngine(RolloutEngine):
    supports_tp = True
    continues_migrated = True
    rescored_logprobs = True
    serves_continuously = True

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
        budget, source = cache_budget(config.kv_cache_memory_gb, config.kv_cache_memory_fraction, self.device)
        if self.tp_group is not None:  # every rank must page alike: the smallest rank's budget
            agreed = torch.tensor([budget], dtype=torch.int64)
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=self.tp_group)
            budget, source = int(agreed[0]), source + ", smallest over TP ranks"
        self.cache_plan = plan_cache(budget=budget, source=source, block_size=config.kv_block_size,
                                     token_bytes=kv_bytes_per_token(self.model_cfg, tp, self.dtype),
                                     max_context=self.max_context, slots=self.slots)
        self.max_blocks = -(-self.max_context // config.kv_block_size)  # a block table's length
        self.preemptions = 0  # sequences preempted (for tests and metrics)
        if self.rank == 0:
            log.info("native engine: %s; max_batch_size %d, max_context %d", self.cache_plan.describe(),
                     self.slots, self.max_context)
        self._tokenizer = tokenizer
        self._residency = ResidencyManager(_TensorBag(self.weights))
        self._rng = random.Random(config.seed)  # same on every TP rank, consumed in the same order

    # --- weights / memory ------------------------------------------------------------------------------
    def weight_layouts(self) -> list[TensorLayout]:
        return self.layouts

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        return self.weights

    def _layout_rank(self) -> int:
        return self.rank

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
        for request in requests:
            self._accept(request, results, queue, on_result)
        if queue:
            self._run(requests, results, queue, on_result)
        return results

    def serve(self, source: RequestSource, on_result: ResultCallback, between_steps: Callable[[], None]) -> None:
        """Serve requests as they come, with no batch boundary, until `source` says it is closed and every
        request taken is done. `source(idle)` hands over new requests ([] for none now, None once closed; it may
        block a little when `idle`); it is asked only while no taken request waits for admission, so requests
        stay with the caller until there is room. `between_steps` runs before every decode step (and while idle):
        the place to apply new weights, so samples in flight go on under them (a partial rollout; each token's
        version is in `RolloutResult.token_versions`)."""
        self._abort.clear()
        if self._residency.is_offloaded("params"):
            raise RuntimeError("native engine: serve() while offloaded; call onload() first")
        if self.tp_group is not None:
            raise RuntimeError("native engine: serve() needs a tp_size 1 engine (replicas agree on no request order)")
        self._run([], [], deque(), on_result, source, between_steps)

    def _accept(self, request: RolloutRequest, results: list[RolloutResult], queue: deque[int],
                on_result: ResultCallback | None) -> bool:
        """Check `request` and add its result slot: queued when it has samples to generate (returns True),
        answered at once when it is rejected or already done."""
        i = len(results)
        error = request_error(request, self.max_context, self.slots) or self._budget_error(request)
        if error is not None:
            results.append(rejected(request, error, self.version))
            if on_result is not None:
                on_result(results[-1])
            return False
        n = request.n
        results.append(RolloutResult(request.request_id, list(request.prompt_ids), [[] for _ in range(n)],
                                     [[] for _ in range(n)], [""] * n, self.version, token_versions=[[] for _ in range(n)]))
        for j, progress in enumerate(request.progress):
            if progress.done:  # finished where it started: kept as it is
                results[-1].response_ids[j], results[-1].logprobs[j] = list(progress.tokens), list(progress.logprobs)
                results[-1].finish_reasons[j] = progress.finish_reason
                results[-1].token_versions[j] = [self.version] * len(progress.tokens)  # made elsewhere: unknown
        if request.unfinished():
            queue.append(i)
            return True
        if on_result is not None:
            on_result(results[-1])
        return False

    def _admission_blocks(self, request: RolloutRequest) -> int:
        """Blocks a request takes when admitted: a fresh one's prompt blocks (full ones shared by its samples),
        a continued one's largest sample (its samples are resumed one by one)."""
        bs = self.cache_plan.block_size
        if request.progress:
            return max(-(-(len(request.prompt_ids) + max(len(p.tokens) - 1, 0)) // bs)
                       for p in request.progress if not p.done)
        full, partial = divmod(len(request.prompt_ids), bs)
        return full + request.n * (partial > 0)

    def _budget_error(self, request: RolloutRequest) -> str | None:
        need, have = self._admission_blocks(request), self.cache_plan.blocks - 1
        if need > have:
            return (f"request {request.request_id!r}: its prompt needs {need} KV cache blocks for n={request.n}, "
                    f"the budget holds {have}; raise rollout.kv_cache_memory_gb or lower n")
        return None

    def _run(self, requests, results, queue: deque[int], on_result: ResultCallback | None,
             source: RequestSource | None = None, between_steps: Callable[[], None] | None = None) -> None:
        plan, bs = self.cache_plan, self.cache_plan.block_size
        if self.decoder.k_cache is None:
            self.decoder.allocate_cache(plan.blocks, bs, self.dtype, self.device)
        pool = BlockPool(plan.blocks)
        free = list(range(self.slots))  # a min-heap: low slots first keeps the decoded range short
        live: dict[int, _Live] = {}
        waiting: list[_Live] = []  # preempted or continued samples, by admission order: resumed before new requests
        remaining = {i: len(requests[i].unfinished()) for i in queue}
        state = _SlotState(self.slots, self.max_blocks, self.device)
        order = itertools.count()

        def finish(slot: int | None, seq: _Live, reason: str) -> None:
            if self.config.logprobs == "rescored" and reason != "abort":
                seq.logprobs = self._rescore(requests[seq.request], seq.tokens)
            result = results[seq.request]
            result.response_ids[seq.sample], result.logprobs[seq.sample] = seq.tokens, seq.logprobs
            result.finish_reasons[seq.sample] = reason
            result.token_versions[seq.sample] = seq.versions
            if slot is not None:
                vacate(slot)
            remaining[seq.request] -= 1
            if remaining[seq.request] == 0 and on_result is not None:
                on_result(result)

        def vacate(slot: int) -> _Live:
            seq = live.pop(slot)
            pool.release(seq.blocks)
            seq.blocks = []
            state.release(slot)
            heapq.heappush(free, slot)
            return seq

        def preempt(slot: int) -> None:
            seq = vacate(slot)
            bisect.insort(waiting, seq, key=lambda s: s.order)
            self.preemptions += 1

        def record(slot: int, seq: _Live, token: int, logprob: float) -> None:
            seq.tokens.append(token)
            seq.logprobs.append(logprob)
            seq.versions.append(self.version)
            reason = self._finish_reason(seq, token)
            if reason is not None:
                finish(slot, seq, reason)

        def take_blocks(seq: _Live, count: int) -> None:
            seq.blocks += [pool.take() for _ in range(count)]

        def rows(blocks: list[int], start: int, stop: int) -> torch.Tensor:
            """Cache token rows of positions start..stop-1 in a sequence with these blocks."""
            pos = torch.arange(start, stop, device=self.device)
            return torch.tensor(blocks, dtype=torch.int64, device=self.device)[pos // bs] * bs + pos % bs

        def resume(seq: _Live) -> None:
            slot = heapq.heappop(free)
            live[slot] = seq
            state.admit([slot], requests[seq.request], [seq.seed])
            take_blocks(seq, -(-max(seq.position, seq.prompt_len) // bs))
            state.table[slot, :len(seq.blocks)] = torch.tensor(seq.blocks, device=self.device)
            first = self._resume(slot, seq, requests[seq.request], state)
            if first is not None:
                record(slot, seq, *first)

        def admit() -> bool:
            """Admit the next waiting sample or request if slots and blocks allow; whether one was."""
            if waiting:  # the oldest first, and no new request overtakes it
                seq = waiting[0]
                if not free or pool.available < -(-max(seq.position, seq.prompt_len) // bs):
                    return False
                resume(waiting.pop(0))
                return True
            if not queue:
                return False
            i = queue[0]
            request = requests[i]
            todo = request.unfinished()
            need = self._admission_blocks(request)
            headroom = len(todo) if live else 0  # one growth block per sample, unless nothing else runs
            if len(free) < len(todo) or pool.available < need + headroom:
                return False
            queue.popleft()
            seqs = [self._new_sequence(i, j, request, next(order)) for j in todo]
            if request.progress:  # migrated: each sample resumes from its own tokens, one by one
                waiting.extend(seqs)
                return True
            slots = [heapq.heappop(free) for _ in todo]
            state.admit(slots, request, [seq.seed for seq in seqs])
            length = len(request.prompt_ids)
            full, partial = divmod(length, bs)
            shared = [pool.take() for _ in range(full)]  # the blocks the prompt fills: one copy for all samples
            write_rows, write_positions = [rows(shared, 0, full * bs)], [torch.arange(full * bs, device=self.device)]
            for _ in seqs[1:]:
                for block in shared:
                    pool.share(block)
            for slot, seq in zip(slots, seqs):
                seq.blocks = list(shared)
                if partial:
                    take_blocks(seq, 1)
                    write_rows.append(rows(seq.blocks, full * bs, length))
                    write_positions.append(torch.arange(full * bs, length, device=self.device))
                state.table[slot, :len(seq.blocks)] = torch.tensor(seq.blocks, device=self.device)
            logits = self.decoder.prefill(torch.tensor(request.prompt_ids, device=self.device),
                                          torch.cat(write_rows), torch.cat(write_positions))
            tokens, logprobs = sample(logits.expand(len(slots), -1), state.params(slots))
            state.after_prefill(slots, tokens, length)
            for slot, seq, token, logprob in zip(slots, seqs, tokens.tolist(), logprobs.tolist()):
                live[slot] = seq
                record(slot, seq, token, logprob)
            return True

        def grow() -> None:
            """Give every live sequence whose next position starts a block that block, preempting the
            newest sequences while too few are free."""
            growing = [slot for slot, seq in live.items() if seq.position // bs >= len(seq.blocks)]
            while len(growing) > pool.available:
                newest = max(live, key=lambda slot: live[slot].order)
                preempt(newest)
                growing = [slot for slot in growing if slot != newest]
            for slot in growing:
                seq = live[slot]
                take_blocks(seq, 1)
                state.table[slot, len(seq.blocks) - 1] = seq.blocks[-1]

        requests = list(requests)  # serving appends to it
        open_ = source is not None
        while queue or live or waiting or open_:
            if open_ and not queue:  # room for more: take what the source has
                more = source(not live and not waiting)
                if more is None:
                    open_ = False
                for request in more or ():
                    requests.append(request)
                    if self._accept(request, results, queue, on_result):
                        remaining[queue[-1]] = len(request.unfinished())
            if between_steps is not None:
                between_steps()
            if self._agree_abort():
                for slot, seq in list(live.items()):
                    finish(slot, seq, "abort")
                for seq in waiting:  # preempted or not yet resumed: aborted with the tokens they have
                    finish(None, seq, "abort")
                waiting.clear()
                for i in queue:  # never started: aborted with the progress they came with
                    for j in requests[i].unfinished():
                        finish(None, self._new_sequence(i, j, requests[i], 0), "abort")
                return
            while admit():
                pass
            if not live:
                continue
            grow()
            span = max(live) + 1
            logits = self.decoder.decode(state.last_token[:span], state.position[:span], state.table[:span])
            tokens, logprobs = sample(logits, state.params(slice(0, span)))
            state.after_decode(span, tokens)
            for slot, token, logprob in zip(range(span), tokens.tolist(), logprobs.tolist()):
                seq = live.get(slot)
                if seq is not None:
                    record(slot, seq, token, logprob)

    def _new_sequence(self, index: int, sample_index: int, request: RolloutRequest, order: int) -> _Live:
        s = request.sampling
        stop_ids = set(s.stop_token_ids) | (set() if s.ignore_eos else set(self.model_cfg.eos_token_ids))
        progress = request.progress[sample_index] if request.progress else None
        return _Live(index, sample_index, len(request.prompt_ids), frozenset(stop_ids), tuple(s.stop_strings),
                     s.max_new_tokens, list(progress.tokens) if progress else [],
                     list(progress.logprobs) if progress else [], seed=self._seed(request, sample_index),
                     order=order, versions=[self.version] * len(progress.tokens) if progress else [])

    def _resume(self, slot: int, seq: _Live, request: RolloutRequest, state: _SlotState) -> tuple[int, float] | None:
        """Put a migrated or preempted sample where it left off: the prompt and all but its last token in
        the cache (its blocks, already taken), the last token next to decode, the sampling step at its
        token count (so it draws the noise it would have drawn). A sample that had not started is
        prefilled; its first (token, logprob) is returned for the caller to record."""
        done = seq.tokens
        prefix = torch.tensor(list(request.prompt_ids) + done[:-1], device=self.device)
        positions = torch.arange(len(prefix), device=self.device)
        cache_rows = torch.tensor(seq.blocks, dtype=torch.int64, device=self.device)[positions // self.cache_plan.block_size]
        cache_rows = cache_rows * self.cache_plan.block_size + positions % self.cache_plan.block_size
        logits = self.decoder.prefill(prefix, cache_rows, positions)
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

    def __init__(self, slots: int, max_blocks: int, device: torch.device):
        self.table = torch.zeros(slots, max_blocks, dtype=torch.int64, device=device)  # block tables; 0: scratch
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
        # Idle slots still ride along in the decoded range: token 0 at position 0 of the scratch
        # block, which no sequence owns; harmless.
        self.table[slot] = 0
        self.active[slot] = False
        self.position[slot] = 0
        self.last_token[slot] = 0
