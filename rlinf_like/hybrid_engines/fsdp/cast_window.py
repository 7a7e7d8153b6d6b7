"""CPU bf16 training: the weights cast to bf16 once per optimizer step instead of once per micro-batch.

Autocast keeps its bf16 copy of each trainable weight (a leaf that requires grad) until its outermost context exits.
One context held open around a step's micro-batches therefore casts each weight once; the copies are the same bits,
and every micro-batch's backward still runs through the cast into the fp32 gradient, so training is bit-identical
(measured on SmolLM2's default-preset step, 2 FSDP ranks: training 25.5 -> 23.9 s, docs/benchmarks/training-step.md).

Under FSDP the micro-batch that reduces the gradients must cast afresh: FSDP reduce-scatters when a block's backward
reaches the block's inputs, and autograd runs the ready node created last first, so a cast node made in the step's
first micro-batch would add its gradient after the reduce-scatter took it (`close` before that micro-batch).

Inside a window, no forward of the same weights may run without gradients: autocast would keep a copy with no
gradient history and hand it to the later forwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class CastWindow:
    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._open: contextlib.ExitStack | None = None

    @contextlib.contextmanager
    def around_step(self) -> Iterator[None]:
        """The context a step's micro-batches run in (nothing when not enabled)."""
        if not self.enabled:
            yield
            return
        with contextlib.ExitStack() as window:
            window.enter_context(torch.autocast("cpu", dtype=torch.bfloat16))
            self._open = window
            try:
                yield
            finally:
                self._open = None

    def close(self) -> None:
        """End the window early: the casts from here to the step's end are fresh."""
        if self._open is not None:
            self._open.close()
