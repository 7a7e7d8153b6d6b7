"""The decode step's linear layers on CPU through MKL's packed GEMM (float32): the same bits, ~10% less time.

MKL's `cblas_sgemm_pack` lays a weight out once in the order its kernel reads it, so a decode step that multiplies
the same weights every step skips that repacking (vLLM's CPU backend prepacks its weights the same way, with
oneDNN). Greedy tokens must stay equal to transformers', so a packed product is used only where it gives the bits
`F.linear` gives: for the usual shapes it does, not with a bias (added in another order) nor for some odd small
shapes (another kernel). That depends on the shapes, not on the values, so the first call of each (weight shape,
rows) compares the two on its input and remembers the answer (that call returns F.linear's result). Only decode
steps of `MIN_ROWS` rows or more use it (a prefill's hundreds of rows and a few stragglers' rows were slower
packed). A packed copy is made at a weight's first use and
again when the weight changed (its version counter, which a weight sync's in-place write or a view of a fused
tensor bumps, or its storage, which an onload moves); `drop()` frees them all (offload). The packed copies take
about as much memory as the weights they pack.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F

MIN_ROWS = 16


def available(weight: torch.Tensor) -> bool:
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkl.is_available()
            and hasattr(torch.ops.mkl, "_mkl_linear"))


class PackedWeights:
    def __init__(self) -> None:
        self._packs: dict[str, tuple[int, int, torch.Tensor]] = {}  # name -> (data_ptr, version, packed)
        self._same_bits: dict[tuple, bool] = {}  # (weight shape, rows, threads) -> packed == F.linear, bitwise
        self._rows = 0  # the rows of the step in progress; 0: not packing

    def drop(self) -> None:
        self._packs.clear()

    @contextmanager
    def enabled(self, rows: int):
        """Use packed weights for this block of calls when `rows` (the batch) is large enough."""
        self._rows = rows if rows >= MIN_ROWS else 0
        try:
            yield
        finally:
            self._rows = 0

    def linear(self, x: torch.Tensor, name: str, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if not self._rows or bias is not None or not available(weight):
            return F.linear(x, weight, bias)
        shape = (tuple(weight.shape), x.numel() // x.shape[-1], torch.get_num_threads())
        if self._same_bits.get(shape) is False:
            return F.linear(x, weight)
        key = (weight.data_ptr(), weight._version)
        held = self._packs.get(name)
        if held is None or held[:2] != key:
            held = (*key, torch.ops.mkl._mkl_reorder_linear_weight(weight.contiguous(), self._rows))
            self._packs[name] = held
        out = torch.ops.mkl._mkl_linear(x, held[2], weight, None, self._rows)
        if shape not in self._same_bits:
            plain = F.linear(x, weight)
            self._same_bits[shape] = torch.equal(out, plain)
            return plain
        return out
