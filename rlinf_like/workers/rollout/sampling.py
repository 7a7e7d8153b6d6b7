"""Token sampling for a batch of sequences with per-row parameters, reproducible per sequence.

Randomness comes from a counter-based hash of (sequence seed, step, token id) rather than a
stateful generator, so a sequence's samples depend only on its own seed: not on which other
sequences share the batch, on the batch order, or on the tensor-parallel rank (every rank draws
the same tokens without a broadcast). A category is drawn with the Gumbel-max trick:
argmax(log p + G) is distributed as p.

`gumbel_argmax` draws exactly the tokens of that recipe without its full cost (on a 49k vocabulary at 128 rows
the hash, two logs in float64 and the temporaries over [B, vocab] took longer than the model's forward pass):
the hash is computed one row block at a time in place (cache-resident), and the logs only for the tokens that
can still win (see its docstring).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (good avalanche), on int64 tensors holding values < 2**32."""
    x = x & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


_ID_MIX: dict[tuple[int, str], torch.Tensor] = {}  # the token ids' hash, which no seed or step changes


def _id_mix(vocab: int, device: torch.device) -> torch.Tensor:
    key = (vocab, str(device))
    if key not in _ID_MIX:
        _ID_MIX[key] = _mix32(torch.arange(vocab, device=device, dtype=torch.int64) + 0x632BE5AB)
    return _ID_MIX[key]


def _base(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    return _mix32(_mix32(seeds) ^ (steps * 0x9E3779B9))


def _mix32_(x: torch.Tensor, tmp: torch.Tensor) -> torch.Tensor:
    """_mix32 in place on values < 2**32 (tmp: scratch of x's shape): the same bits, no new tensors."""
    for last in (False, False, True):
        torch.bitwise_right_shift(x, 16, out=tmp)
        x.bitwise_xor_(tmp)
        if not last:
            x.mul_(0x45D9F3B).bitwise_and_(_MASK32)
    return x


def _gumbel_of(bits: torch.Tensor) -> torch.Tensor:
    """The float32 Gumbel noise of hash values (what -log(-log(uniform_noise)) gives, computed the same way)."""
    return -torch.log(-torch.log((bits.double() + 0.5) / 2.0**32)).float()


def uniform_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """U(0, 1) of shape [B, vocab], a pure function of (seed, step, token id)."""
    base = _mix32(_mix32(seeds) ^ (steps * 0x9E3779B9))
    ids = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    bits = _mix32(base[:, None] ^ _mix32(ids + 0x632BE5AB)[None])
    return (bits.double() + 0.5) / 2.0**32


def gumbel_argmax(scores: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor, block: int = 1 << 16) -> torch.Tensor:
    """argmax(scores + gumbel) per row [B], where gumbel = -log(-log(uniform_noise(seeds, steps, V))).float():
    the same tokens, ties included. The noise grows with the hash, so a row's largest hash bounds its noise
    (gmax); a token j can only win if scores[j] + gmax reaches what some token already scores (float32 rounding
    is monotone, so the test is exact). The logs run on those candidates only: a few hundred of a trained
    model's 49k tokens at temperature 1 (every token of a near-uniform row, which is then no cheaper)."""
    b, vocab = scores.shape
    rows = max(1, block // vocab)  # row blocks of ~64k hash values: the scratch stays in cache
    ids, base = _id_mix(vocab, scores.device), _base(seeds, steps)
    bits = torch.empty(min(rows, b), vocab, dtype=torch.int64, device=scores.device)
    tmp = torch.empty_like(bits)
    out = torch.empty(b, dtype=torch.int64, device=scores.device)
    best = scores.argmax(dim=-1, keepdim=True)  # with the largest hash's token: totals every winner must reach
    for lo in range(0, b, rows):
        hi = min(lo + rows, b)
        x, s = bits[: hi - lo], scores[lo:hi]
        torch.bitwise_xor(base[lo:hi, None], ids[None], out=x)
        _mix32_(x.bitwise_and_(_MASK32), tmp[: hi - lo])
        top_bits, top_at = x.max(dim=-1, keepdim=True)
        gmax = _gumbel_of(top_bits)
        reach = torch.maximum(s.gather(1, best[lo:hi]) + _gumbel_of(x.gather(1, best[lo:hi])),
                              s.gather(1, top_at) + gmax)
        at = ((s + gmax) >= reach).view(-1).nonzero()[:, 0]  # the candidates, flat
        total = torch.full_like(s, float("-inf"))
        total.view(-1)[at] = s.reshape(-1)[at] + _gumbel_of(x.view(-1)[at])
        out[lo:hi] = total.argmax(dim=-1)
    return out


@dataclass
class RowParams:
    """Per-row sampling parameters as tensors (temperature 0 rows are greedy)."""

    temperature: torch.Tensor  # float [B]
    top_k: torch.Tensor  # int64 [B], 0 = off
    top_p: torch.Tensor  # float [B]
    seeds: torch.Tensor  # int64 [B]
    steps: torch.Tensor  # int64 [B], tokens generated so far


def sample(logits: torch.Tensor, params: RowParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [B], logprobs [B]); logprobs under softmax(logits / temperature), before top-k/top-p."""
    greedy = params.temperature == 0
    temperature = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    scaled = logits.float() / temperature[:, None]
    logprobs = torch.log_softmax(scaled, dim=-1)
    tokens = scaled.argmax(dim=-1)
    if not bool(greedy.all()):
        filtered = _filter(scaled, params.top_k, params.top_p)
        log_p = logprobs if filtered is scaled else torch.log_softmax(filtered, dim=-1)
        drawn = gumbel_argmax(log_p, params.seeds, params.steps)
        tokens = torch.where(greedy, tokens, drawn)
    return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]


def _filter(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Set logits outside each row's top-k and top-p nucleus to -inf (the top token always stays)."""
    if bool((top_k == 0).all()) and bool((top_p >= 1.0).all()):
        return scaled
    vocab = scaled.shape[-1]
    ordered, order = scaled.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=scaled.device)[None]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    ordered = ordered.masked_fill(rank >= k[:, None], float("-inf"))
    probs = torch.softmax(ordered, dim=-1)  # top-p applies to what top-k kept, as in transformers
    ordered = ordered.masked_fill((probs.cumsum(-1) - probs) >= top_p[:, None], float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(-1, order, ordered)
