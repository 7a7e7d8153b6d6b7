"""Decode steps on fixed shapes, replayed as CUDA graphs on a GPU.

A decode step of a small model on a GPU is launch-bound: hundreds of small kernels whose launches cost more CPU
time than the GPU spends running them. A CUDA graph records one step's kernels once and replays them with one
launch. A graph holds fixed shapes and fixed memory, so a step runs on static buffers: the batch padded up to a
bucket (`BATCH_BUCKETS`), attention over a span padded up to a bucket (`span_bucket`), and the inputs copied into
the bucket's buffers before each replay. Padded rows decode token 0 at position 0 through block 0, the engine's
scratch block, which no sequence owns; their logits are dropped. Rows past a sequence's own length are masked, so a
padded span changes no token (the sums run over more zero weights; logprobs may differ in their last bits).

Graphs are captured for every bucket the engine can meet at start-up (`warm`), so the first call runs at speed.
Sampling stays outside the graph: it reads its parameters back to choose its path.

Without a GPU (`use_graphs=False`) the same static buffers run eagerly: the path the CPU tests check.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
MIN_SPAN = 256  # span buckets: 256, 512, 1024, ... up to the engine's max_context


def batch_bucket(rows: int) -> int:
    i = bisect.bisect_left(BATCH_BUCKETS, rows)
    if i == len(BATCH_BUCKETS):
        raise ValueError(f"native engine: {rows} rows exceed the largest decode bucket ({BATCH_BUCKETS[-1]})")
    return BATCH_BUCKETS[i]


def span_bucket(span: int, max_context: int) -> int:
    bucket = MIN_SPAN
    while bucket < span:
        bucket *= 2
    return min(bucket, max_context)


@dataclass
class _Step:
    tokens: torch.Tensor  # [bucket] int64
    positions: torch.Tensor  # [bucket] int64
    table: torch.Tensor  # [bucket, max_blocks] int64
    logits: torch.Tensor | None = None  # [bucket, V]: the graph's output buffer
    graph: torch.cuda.CUDAGraph | None = None


class StaticDecode:
    """`decoder.decode` on bucketed static buffers, each (batch bucket, span bucket) captured as a CUDA graph once."""

    def __init__(self, decoder, max_blocks: int, max_context: int, device: torch.device, use_graphs: bool):
        self.decoder, self.max_blocks, self.max_context = decoder, max_blocks, max_context
        self.device, self.use_graphs = device, use_graphs
        self.steps: dict[tuple[int, int], _Step] = {}
        self.pool = None  # one memory pool for every graph: they never run at the same time

    def drop(self) -> None:
        """Forget every step and graph (they hold the addresses of the weights and the KV cache)."""
        self.steps.clear()
        self.pool = None

    def buckets(self, max_rows: int) -> list[tuple[int, int]]:
        spans, span = [], span_bucket(1, self.max_context)
        while True:
            spans.append(span)
            if span >= self.max_context:
                break
            span = span_bucket(span + 1, self.max_context)
        return [(b, s) for b in BATCH_BUCKETS[:BATCH_BUCKETS.index(batch_bucket(max_rows)) + 1] for s in spans]

    def warm(self, max_rows: int) -> int:
        """Build (and on a GPU capture) every step the engine can meet; how many."""
        for key in self.buckets(max_rows):
            self._step(key)
        return len(self.steps)

    def _step(self, key: tuple[int, int]) -> _Step:
        step = self.steps.get(key)
        if step is not None:
            return step
        rows, _ = key
        zeros = dict(dtype=torch.int64, device=self.device)
        step = _Step(torch.zeros(rows, **zeros), torch.zeros(rows, **zeros),
                     torch.zeros(rows, self.max_blocks, **zeros))
        if self.use_graphs:
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):  # a warm-up run off the capture: lazy initialisations happen here
                self._run(step, key[1])
            torch.cuda.current_stream(self.device).wait_stream(stream)
            step.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(step.graph, pool=self.pool):
                step.logits = self._run(step, key[1])
            self.pool = step.graph.pool()
        self.steps[key] = step
        return step

    def _run(self, step: _Step, span: int) -> torch.Tensor:
        return self.decoder.decode(step.tokens, step.positions, step.table, batch_key=None, span=span)

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor, table: torch.Tensor, span: int) -> torch.Tensor:
        """Logits [B, V] of one decode step (as `Decoder.decode`), `span`: the longest sequence's length."""
        b = tokens.shape[0]
        key = (batch_bucket(b), span_bucket(span, self.max_context))
        step = self._step(key)
        step.tokens[:b], step.positions[:b], step.table[:b] = tokens, positions, table
        step.tokens[b:], step.positions[b:], step.table[b:] = 0, 0, 0  # padding: scratch block 0
        if step.graph is None:
            return self._run(step, key[1])[:b]
        step.graph.replay()
        return step.logits[:b]
