"""The decode step's linear layers on CPU with weights laid out once in the order the GEMM kernel reads them.

A decode step multiplies the same weights every step, so repacking them every call is waste (vLLM's CPU backend
prepacks its weights the same way). Two kernels, by the weights' dtype:
- float32: MKL's packed GEMM (`cblas_sgemm_pack`), ~10% less time, used from `MIN_ROWS` rows (a prefill's hundreds
  of rows and a few stragglers' rows were slower packed);
- bfloat16: oneDNN's prepacked matmul (the kernel `torch.compile`'s freezing uses), measured on a Zen 4 host 2x
  F.linear at one row, ~20% at 32, ~5% at 128 (`docs/benchmarks/rollout.md`), so used at every batch size;
- float32 with `rollout.fp32_kernels=onednn`: oneDNN's prepacked matmul too, 2.4-3.5x F.linear on that host at
  decode shapes (MKL's sgemm there is slow), at every batch size, without F.linear's bits (sums in another order:
  logprobs move by ~1e-6 relative), so not by default.
Otherwise greedy tokens must stay equal to the unpacked engine's, so a packed product is used only where it gives the
bits `F.linear` gives: for the usual shapes it does, not with a bias (added in another order) nor for some odd small
shapes (another kernel). That depends on the shapes, not on the values, so the first call of each (weight shape,
rows, dtype) compares the two on its input and remembers the answer (that call returns F.linear's result).

Packing a weight costs many products of it (on a Zen 4 host, SmolLM2's layer at 16 rows: 8 ms to pack in bf16
against 0.25 ms saved a product; in float32 14 ms against nothing saved), and an RL loop changes the weights every
step, so a rollout of a few tokens would pack everything and barely use it. A weight is packed once it has served
`PACK_AFTER` products unchanged (F.linear until then, `fp32_kernels=onednn` included), and again after that many
once it changed (its version counter, which a weight sync's in-place write or a view of a fused tensor bumps, or its
storage, which an onload moves); `drop()` frees them all (offload). The packed copies take about as much memory as
the weights they pack.
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache

import torch
import torch.nn.functional as F

MIN_ROWS = 16  # float32 (MKL) only
PACK_AFTER = 16  # products of one weight version before it is packed: a pack pays back over ~14-33 products in bf16


def _mkl_pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkl._mkl_reorder_linear_weight(weight.contiguous(), rows)


def _mkl_run(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkl._mkl_linear(x, packed, weight, None, rows)


def _onednn_pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), rows)


def _onednn_run(x: torch.Tensor, packed: torch.Tensor, weight: torch.Tensor, rows: int) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


def kernel(weight: torch.Tensor, fp32_onednn: bool = False):
    """(pack, run, min_rows, same_bits_only) for this weight, or None where no packed kernel serves it."""
    return _kernel_for(weight.device.type, weight.dtype, fp32_onednn)


@lru_cache(maxsize=None)  # asked at every linear call of a decode step; the answer depends on these three only
def _kernel_for(device_type: str, dtype: torch.dtype, fp32_onednn: bool):
    if device_type != "cpu":
        return None
    onednn = torch.backends.mkldnn.is_available()
    if dtype == torch.float32 and fp32_onednn and onednn:
        return _onednn_pack, _onednn_run, 1, False
    if dtype == torch.float32 and torch.backends.mkl.is_available() and hasattr(torch.ops.mkl, "_mkl_linear"):
        return _mkl_pack, _mkl_run, MIN_ROWS, True
    if dtype == torch.bfloat16 and onednn and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return _onednn_pack, _onednn_run, 1, True
    return None


def available(weight: torch.Tensor, fp32_onednn: bool = False) -> bool:
    return kernel(weight, fp32_onednn) is not None


class PackedWeights:
    def __init__(self, fp32_onednn: bool = False) -> None:
        self.fp32_onednn = fp32_onednn
        self._packs: dict[str, tuple[int, int, torch.Tensor]] = {}  # name -> (data_ptr, version, packed)
        self._same_bits: dict[tuple, bool] = {}  # (weight shape, dtype, rows, threads) -> packed == F.linear
        self._uses: dict[str, tuple[int, int, int]] = {}  # name -> (data_ptr, version, products) while unpacked
        self._rows = 0  # the rows of the step in progress; 0: not packing

    def drop(self) -> None:
        self._packs.clear()
        self._uses.clear()

    @contextmanager
    def enabled(self, rows: int):
        """Use packed weights for this block of calls (where the kernel serves `rows`, the batch)."""
        self._rows = rows
        try:
            yield
        finally:
            self._rows = 0

    def linear(self, x: torch.Tensor, name: str, weight: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
        chosen = kernel(weight, self.fp32_onednn) if self._rows and bias is None and x.dtype == weight.dtype else None
        if chosen is None or self._rows < chosen[2]:
            return F.linear(x, weight, bias)
        pack, run, _, same_bits_only = chosen
        shape = (tuple(weight.shape), weight.dtype, x.numel() // x.shape[-1], torch.get_num_threads())
        if self._same_bits.get(shape) is False:
            return F.linear(x, weight)
        key = (weight.data_ptr(), weight._version)
        held = self._packs.get(name)
        if held is None or held[:2] != key:
            seen = self._uses.get(name)
            uses = seen[2] + 1 if seen is not None and seen[:2] == key else 1
            self._uses[name] = (*key, uses)
            if uses < PACK_AFTER:
                self._packs.pop(name, None)  # a stale copy: no longer read, its memory free
                return F.linear(x, weight)
            held = (*key, pack(weight, self._rows))
            self._packs[name] = held
        out = run(x, held[2], weight, self._rows)
        if same_bits_only and shape not in self._same_bits:
            plain = F.linear(x, weight)
            self._same_bits[shape] = torch.equal(out, plain)
            return plain
        return out
