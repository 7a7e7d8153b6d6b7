"""The native engine's continuous-batching loop: one `generate` or `serve` call (see `engine.py`).

Each round: take what the source has, run `between_steps`, drop the prefix cache if the weights changed,
admit what fits (the preempted first, then new requests in order), prefill everything admitted in the round
in one pass (`Decoder.prefill`: every sequence from where its cached prefix ends), give growing sequences
their next block (preempting the newest while too few are free), and decode one token for every live slot,
and for those only.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from rlinf_like.workers.rollout.base import RequestSource, ResultCallback
from rlinf_like.workers.rollout.engines.native.model import Chunk
from rlinf_like.workers.rollout.engines.native.slots import SlotState
from rlinf_like.workers.rollout.engines.sampling import sample
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult


def route_dtype(cfg) -> torch.dtype:
    return torch.uint8 if cfg.num_experts <= 256 else torch.int16


def finished_routes(seq: LiveSample) -> torch.Tensor:
    """A finished sample's routes aligned with prompt + response: every position the passes ran, and a row of
    zeros for the last token, which no pass ran (the trainer's forward at that position feeds no loss)."""
    routes = torch.cat(seq.routes)
    return torch.cat([routes, routes.new_zeros((1, *routes.shape[1:]))])


_LOOPS = itertools.count()  # a serial per loop: a decoder's mirror never outlives the loop that built it


@dataclass
class LiveSample:
    """One sample being decoded in a batch slot (or waiting to be resumed)."""

    request: int  # index into the call's requests
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
    generation: int = -1  # the prefix cache's generation its keys/values began in (older: not cached)
    # rollout.return_routes: the MoE routes of its positions so far, as the passes computed them ([n, layers, k]
    # pieces in position order: the prefill's, then one per decode step)
    routes: list[torch.Tensor] = field(default_factory=list)

    @property
    def position(self) -> int:
        """Where its next decode step writes: prompt + tokens, less the last token (not yet in the cache)."""
        return self.prompt_len + len(self.tokens) - 1


@dataclass
class _Prefill:
    """Sequences admitted this round that one chunk of the round's prefill computes."""

    chunk: Chunk
    slots: list[int]
    seqs: list[LiveSample]
    first: bool  # sample each slot's first token from the chunk's logits (not for a resumed sample)


class BatchLoop:
    def __init__(self, engine: Any, requests: list[RolloutRequest], results: list[RolloutResult],
                 queue: deque[int], on_result: ResultCallback | None):
        """`engine`: the `NativeEngine` that runs this loop (not imported here: engine.py imports this module)."""
        self.engine, self.requests, self.results, self.queue = engine, requests, results, queue
        self.on_result = on_result
        self.pool = engine._block_pool()
        self.bs, self.device = self.pool.block_size, engine.device
        self.free = list(range(engine.slots))  # a min-heap of free slots
        self.live: dict[int, LiveSample] = {}
        self.waiting: list[LiveSample] = []  # preempted or continued samples, by admission order: resumed first
        self.remaining = {i: len(requests[i].unfinished()) for i in queue}
        self.state = SlotState(engine.slots, engine.max_blocks, engine.device)
        self.order = itertools.count()
        self.serial, self.roster = next(_LOOPS), 0  # roster: bumped whenever a slot is seated or vacated
        # keep each pass's mixture-of-experts routes (rollout.return_routes): the experts each token ran through
        self.routes = engine.config.return_routes and engine.model_cfg.is_moe_model

    def run(self, source: RequestSource | None, between_steps: Callable[[], None] | None) -> None:
        try:
            self._run(source, between_steps)
        finally:
            self.engine.decoder.mirror.drop()  # its memory is the live batch's keys and values

    def _run(self, source: RequestSource | None, between_steps: Callable[[], None] | None) -> None:
        open_ = source is not None
        while self.queue or self.live or self.waiting or open_:
            if open_ and not self.queue:  # room for more: take what the source has
                more = source(not self.live and not self.waiting)
                open_ = more is not None
                for request in more or ():
                    self.requests.append(request)
                    if self.engine._accept(request, self.results, self.queue, self.on_result):
                        self.remaining[self.queue[-1]] = len(request.unfinished())
            if between_steps is not None:
                between_steps()
            self.engine._check_weights(self.pool)
            if self.engine._agree_abort():
                self._abort()
                return
            self._admit()
            if self.live:
                self._grow()
                self._decode()

    # --- a sample's life ---------------------------------------------------------------------------------
    def _record(self, slot: int, seq: LiveSample, token: int, logprob: float) -> None:
        seq.tokens.append(token)
        seq.logprobs.append(logprob)
        seq.versions.append(self.engine.version)
        reason = self.engine._finish_reason(seq, token)
        if reason is not None:
            self._finish(slot, seq, reason)

    def _finish(self, slot: int | None, seq: LiveSample, reason: str) -> None:
        result = self.results[seq.request]
        if self.engine.config.logprobs == "rescored" and reason != "abort":
            seq.logprobs = self.engine._rescore(self.requests[seq.request], seq.tokens)
        if self.routes and reason != "abort":
            if not result.routes:
                result.routes = [None] * len(result.response_ids)
            result.routes[seq.sample] = finished_routes(seq)
        result.response_ids[seq.sample], result.logprobs[seq.sample] = seq.tokens, seq.logprobs
        result.finish_reasons[seq.sample] = reason
        result.token_versions[seq.sample] = seq.versions
        if slot is not None:
            self._vacate(slot)
        self.remaining[seq.request] -= 1
        if self.remaining[seq.request] == 0 and self.on_result is not None:
            self.on_result(result)

    def _vacate(self, slot: int) -> LiveSample:
        """Free a slot and its sample's blocks, the full ones kept in the prefix cache (what is in the cache:
        every position before the next write)."""
        seq = self.live.pop(slot)
        self.roster += 1
        held = (list(self.requests[seq.request].prompt_ids) + seq.tokens)[:seq.position]
        self.pool.insert(held, seq.blocks, seq.generation)
        self.pool.release(seq.blocks)
        seq.blocks = []
        self.state.release(slot)
        heapq.heappush(self.free, slot)
        return seq

    def _abort(self) -> None:
        for slot, seq in list(self.live.items()):
            self._finish(slot, seq, "abort")
        for seq in self.waiting:  # preempted or not yet resumed: aborted with the tokens they have
            self._finish(None, seq, "abort")
        self.waiting.clear()
        for i in self.queue:  # never started: aborted with the progress they came with
            for j in self.requests[i].unfinished():
                self._finish(None, self.engine._new_sequence(i, j, self.requests[i], 0), "abort")

    @contextmanager
    def _capture(self):
        """Around one pass: yields a list that then holds the pass's routes, [tokens, MoE layers, k] on the host
        (nothing unless this loop keeps routes)."""
        decoder, out = self.engine.decoder, []
        decoder.capture_routes, decoder.routes = self.routes, []
        try:
            yield out
        finally:
            decoder.capture_routes = False
        if self.routes:
            out.append(torch.stack(decoder.routes, dim=1).to("cpu", route_dtype(self.engine.model_cfg)))

    # --- admission and prefill ---------------------------------------------------------------------------
    def _rows(self, blocks: list[int], start: int, stop: int) -> list[int]:
        """Cache token rows of positions start..stop-1 in a sequence with these blocks."""
        bs = self.bs
        return [blocks[p // bs] * bs + p % bs for p in range(start, stop)]

    def _place(self, tokens: list[int], copies: int, headroom: int) -> tuple[Chunk, list[list[int]]] | None:
        """Block tables for `copies` sequences holding `tokens` in the cache, and the chunk that computes them:
        the cached prefix taken (at least the last token is computed, into blocks of their own), the rest of
        the full blocks taken once and shared, the last partial block one per copy. None when too few blocks
        are available (`headroom` more kept free)."""
        bs, length = self.bs, len(tokens)
        hits = self.pool.lookup(tokens, (length - 1) // bs)
        full, partial = divmod(length, bs)
        fresh = full - len(hits) + copies * (partial > 0)
        if self.pool.available - self.pool.idle_among(hits) < fresh + headroom:
            return None
        self.pool.acquire(hits)
        shared = hits + [self.pool.take() for _ in range(full - len(hits))]
        for _ in range(copies - 1):
            for block in shared:
                self.pool.share(block)
        tables = [shared + ([self.pool.take()] if partial else []) for _ in range(copies)]
        # indexed now: this round's prefill writes them, at every layer before any chunk reads them
        self.pool.insert(tokens[:full * bs], shared, self.pool.generation)
        start = len(hits) * bs
        rows = self._rows(tables[0], 0, length)
        write_rows, write_index = rows[start:], list(range(length - start))
        for table in tables[1:] if partial else ():  # every other copy's own last block
            write_rows += self._rows(table, full * bs, length)
            write_index += range(full * bs - start, length - start)
        return Chunk(ids=list(tokens[start:]), start=start, rows=rows, write_rows=write_rows,
                     write_index=write_index), tables

    def _seat(self, slots: list[int], seqs: list[LiveSample], tables: list[list[int]]) -> None:
        for slot, seq, table in zip(slots, seqs, tables):
            seq.blocks, seq.generation = table, self.pool.generation
            self.state.table[slot, :len(table)] = torch.tensor(table, device=self.device)
            self.live[slot] = seq
        self.roster += 1

    def _admit_next(self, jobs: list[_Prefill]) -> bool:
        """Admit the next waiting sample or request if slots and blocks allow (its prefill joins `jobs`)."""
        if self.waiting:  # the oldest first, and no new request overtakes it
            seq = self.waiting[0]
            request = self.requests[seq.request]
            placed = self._place(list(request.prompt_ids) + seq.tokens[:-1], 1, 0) if self.free else None
            if placed is None:
                return False
            self.waiting.pop(0)
            slot = heapq.heappop(self.free)
            self.state.admit([slot], request, [seq.seed])
            self._seat([slot], [seq], placed[1])
            if seq.tokens:  # the last token is next to decode, at the sampling step its count gives
                self.state.resume(slot, seq.tokens[-1], seq.position, len(seq.tokens))
            jobs.append(_Prefill(placed[0], [slot], [seq], first=not seq.tokens))
            return True
        if not self.queue:
            return False
        i = self.queue[0]
        request = self.requests[i]
        todo = request.unfinished()
        headroom = len(todo) if self.live else 0  # one growth block per sample, unless nothing else runs
        if len(self.free) < len(todo):
            return False
        if request.progress:  # migrated: each sample resumes from its own tokens, one by one
            if self.pool.available < self.engine._admission_blocks(request) + headroom:
                return False
            self.queue.popleft()
            self.waiting.extend(self.engine._new_sequence(i, j, request, next(self.order)) for j in todo)
            return True
        placed = self._place(list(request.prompt_ids), len(todo), headroom)
        if placed is None:
            return False
        self.queue.popleft()
        seqs = [self.engine._new_sequence(i, j, request, next(self.order)) for j in todo]
        slots = [heapq.heappop(self.free) for _ in todo]
        self.state.admit(slots, request, [seq.seed for seq in seqs])
        self._seat(slots, seqs, placed[1])
        jobs.append(_Prefill(placed[0], slots, seqs, first=True))
        return True

    def _admit(self) -> None:
        jobs: list[_Prefill] = []
        while self._admit_next(jobs):
            pass
        if not jobs:
            return
        with self._capture() as routes:
            logits = self.engine.decoder.prefill([job.chunk for job in jobs])
        if self.routes:  # the prefill computed every position from 0 (return_routes turns the prefix cache off)
            offset = 0
            for job in jobs:
                n = len(job.chunk.ids)
                for seq in job.seqs:
                    seq.routes = [routes[0][offset:offset + n]]
                offset += n
        self.engine.prefilled_tokens += sum(len(job.chunk.ids) for job in jobs)
        self.engine.prefix_hit_tokens += sum(job.chunk.start for job in jobs)
        firsts = [(k, slot, seq) for k, job in enumerate(jobs) if job.first for slot, seq in zip(job.slots, job.seqs)]
        if not firsts:
            return
        slots = [slot for _, slot, _ in firsts]
        lengths = torch.tensor([seq.prompt_len for _, _, seq in firsts], device=self.device)
        picked = logits[torch.tensor([k for k, _, _ in firsts], device=self.device)]
        tokens, logprobs = sample(picked, self.state.params(slots), self.engine.sampler_workspace)
        self.state.after_prefill(slots, tokens, lengths)
        for (_, slot, seq), token, logprob in zip(firsts, tokens.tolist(), logprobs.tolist()):
            self._record(slot, seq, token, logprob)

    # --- decoding ----------------------------------------------------------------------------------------
    def _preempt(self, slot: int) -> None:
        seq = self._vacate(slot)
        bisect.insort(self.waiting, seq, key=lambda s: s.order)
        self.engine.preemptions += 1

    def _grow(self) -> None:
        """Give every live sequence whose next position starts a block that block, preempting the newest
        sequences while too few are free."""
        growing = [slot for slot, seq in self.live.items() if seq.position // self.bs >= len(seq.blocks)]
        while len(growing) > self.pool.available:
            newest = max(self.live, key=lambda slot: self.live[slot].order)
            self._preempt(newest)
            growing = [slot for slot in growing if slot != newest]
        for slot in growing:
            seq = self.live[slot]
            seq.blocks.append(self.pool.take())
            self.state.table[slot, len(seq.blocks) - 1] = seq.blocks[-1]

    def _decode(self) -> None:
        slots = sorted(self.live)
        rows = torch.tensor(slots, device=self.device)
        state = self.state
        span = max(seq.position for seq in self.live.values()) + 1  # known here: the step reads nothing back
        with self._capture() as routes:
            logits = self.engine.decode_step(state.last_token[rows], state.position[rows], state.table[rows],
                                             batch_key=(self.serial, self.roster), span=span)
        for i, slot in enumerate(slots if self.routes else ()):
            self.live[slot].routes.append(routes[0][i:i + 1])
        tokens, logprobs = sample(logits, state.params(rows), self.engine.sampler_workspace)
        state.after_decode(rows, tokens)
        for slot, token, logprob in zip(slots, tokens.tolist(), logprobs.tolist()):
            self._record(slot, self.live[slot], token, logprob)
