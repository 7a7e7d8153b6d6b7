"""Token sampling for a batch of sequences with per-row parameters, reproducible per sequence.

Randomness comes from a counter-based hash of (sequence seed, step) rather than a stateful generator, so a
sequence's draws depend only on its own seed: not on which other sequences share the batch, on the batch order,
or on the tensor-parallel rank (every rank draws the same tokens without a broadcast).

A token is drawn by inverting the row's CDF with one uniform number per row: token = the first index whose
cumulative probability exceeds u * total. Only floating-point passes touch the whole vocabulary (the max, one
exp, block sums); the integer hash runs once per row. The search is two-level so no [B, V] cumulative sum is
built: block sums (in float64) pick the block, then one block's cumulative sum picks the token. A Gumbel-max draw
needs a hashed noise value per vocabulary entry, which at 49k-262k entries took longer than the decode step's
matmuls (`docs/benchmarks/rollout.md`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

_MASK32 = 0xFFFFFFFF
BLOCK = 1024  # vocabulary entries per block of the two-level search


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (good avalanche), on int64 tensors holding values < 2**32."""
    x = x & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


def uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """U(0, 1) per row [B] in float64 with 53 random bits, a pure function of (seed, step)."""
    base = _mix32(_mix32(seeds) ^ (steps * 0x9E3779B9))
    high, low = _mix32(base ^ 0x632BE5AB), _mix32(base ^ 0x2545F491)
    return ((high << 21) + (low >> 11)).double().add_(0.5).mul_(2.0**-53)


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of weights [B, V] (non-negative, unnormalised, some positive), the first index whose running sum
    exceeds u * the row's total; never an index of weight 0."""
    b, vocab = weights.shape
    whole = vocab // BLOCK * BLOCK
    sums = [weights[:, :whole].view(b, -1, BLOCK).sum(-1)] if whole else []
    if whole < vocab:
        sums.append(weights[:, whole:].sum(-1, keepdim=True))
    block_sums = torch.cat(sums, dim=1).double()
    running = block_sums.cumsum(-1)
    target = u * running[:, -1]
    blocks = block_sums.shape[1]
    last_positive = torch.where(block_sums > 0, torch.arange(blocks, device=weights.device), -1).amax(-1)
    block = torch.searchsorted(running, target[:, None], right=True)[:, 0].minimum(last_positive)
    before = torch.where(block > 0, running.gather(1, (block - 1).clamp(min=0)[:, None])[:, 0], 0.0)
    offsets = torch.arange(BLOCK, device=weights.device)
    index = block[:, None] * BLOCK + offsets  # [B, BLOCK]; past the vocabulary in a partial last block
    inside = index < vocab
    values = weights.gather(1, index.clamp(max=vocab - 1)).masked_fill(~inside, 0).double()
    inner = values.cumsum(-1)
    j = torch.searchsorted(inner, (target - before)[:, None], right=True)[:, 0]
    last = torch.where(values > 0, offsets, -1).amax(-1)  # rounding can carry the target past the block's end
    return block * BLOCK + j.minimum(last)


@dataclass
class RowParams:
    """Per-row sampling parameters as tensors (temperature 0 rows are greedy)."""

    temperature: torch.Tensor  # float [B]
    top_k: torch.Tensor  # int64 [B], 0 = off
    top_p: torch.Tensor  # float [B]
    seeds: torch.Tensor  # int64 [B]
    steps: torch.Tensor  # int64 [B], tokens generated so far


class Workspace:
    """Two float32 [rows, V] buffers kept from one step to the next: on CPU a fresh tensor that large is fresh pages
    from the OS, and faulting them in cost more than the arithmetic (a [128, 49152] conversion: ~10x)."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []

    def get(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, vocab = like.shape
        if not self._buffers or self._buffers[0].shape[0] < rows or self._buffers[0].shape[1] != vocab \
                or self._buffers[0].device != like.device:
            self._buffers = [torch.empty(rows, vocab, device=like.device) for _ in range(2)]
        return self._buffers[0][:rows], self._buffers[1][:rows]


# rows sampled together: their two float32 [rows, V] buffers stay within this (a 262k vocabulary: 32 rows)
WORKSPACE_BYTES = 32 << 20


def sample(logits: torch.Tensor, params: RowParams, workspace: Workspace | None = None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B], logprobs [B]); logprobs under softmax(logits / temperature), before top-k/top-p. Rows are
    independent, so they are sampled a bounded block at a time (`WORKSPACE_BYTES`)."""
    rows = max(1, WORKSPACE_BYTES // (4 * logits.shape[-1]))
    if logits.shape[0] <= rows:
        return _sample(logits, params, workspace)
    parts = [_sample(logits[i:i + rows], RowParams(*(t[i:i + rows] for t in _columns(params))), workspace)
             for i in range(0, logits.shape[0], rows)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def _columns(params: RowParams) -> tuple[torch.Tensor, ...]:
    return tuple(getattr(params, f.name) for f in fields(params))


def _sample(logits: torch.Tensor, params: RowParams, workspace: Workspace | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    greedy = params.temperature == 0
    buffer, weights = (workspace or Workspace()).get(logits)
    # float32 in a kept buffer (a mixed-dtype op would convert into a fresh temporary: page faults every step)
    scaled = logits if logits.dtype == torch.float32 else buffer.copy_(logits)
    if not bool((params.temperature == 1).all()):
        temperature = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
        scaled = torch.div(scaled, temperature[:, None], out=buffer)
    top, tokens = scaled.max(dim=-1)
    torch.sub(scaled, top[:, None], out=weights).exp_()  # softmax's numerator, its largest entry exactly 1
    log_total = weights.sum(-1).log()
    if not bool(greedy.all()):
        filtering = not (bool((params.top_k == 0).all()) and bool((params.top_p >= 1.0).all()))
        drawn_from = (torch.exp(_filter(scaled, params.top_k, params.top_p) - top[:, None]) if filtering
                      else weights)
        drawn = inverse_cdf(drawn_from, uniform(params.seeds, params.steps))
        tokens = torch.where(greedy, tokens, drawn)
    return tokens, scaled.gather(-1, tokens[:, None])[:, 0] - top - log_total


def _filter(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p nucleus to -inf (the top token always stays)."""
    vocab = scaled.shape[-1]
    ordered, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=scaled.device)[None]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    ordered = ordered.masked_fill(rank >= k[:, None], float("-inf"))
    probs = torch.softmax(ordered, dim=-1)  # top-p applies to what top-k kept, as in transformers
    ordered = ordered.masked_fill((probs.cumsum(-1) - probs) >= top_p[:, None], float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(-1, order, ordered)
