"""Per-token logprobs and entropy of an HF causal LM without its [B, T, V] logits.

A real vocabulary makes the output layer the largest tensor of a step: SmolLM2 (V = 49,152) at 256 rows x 60
tokens is 3 GB of fp32 logits, and `log_softmax` plus the entropy's `exp` keep two more copies alive for the
backward. Here the model's output layer is swapped, for one forward, for a head that computes the two numbers
per position directly: it runs the layer only at the positions a loss reads (response tokens), a chunk of rows
at a time, and under autograd each chunk is checkpointed, so the backward recomputes one chunk's logits at a time
instead of keeping them all.

The head's output takes the logits' place in the model's output ([B, T, 2]: logprob and entropy), so wrappers
that hook the model's outputs (FSDP2's pre-backward unshard) see it as the forward's result.

A chunk's numbers are the same ops on the same rows as a full pass: log_softmax and the entropy reduce within a
row. Only the output layer's matmul sees fewer rows, and GEMM kernels may round a row differently when given
very few (below ~64 rows on one Zen 4 host; docs/benchmarks/exactness.md), so chunks are never cut that small.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

CHUNK_BYTES = 256 << 20  # fp32 logits per chunk; a batch whose whole logits fit runs in one plain pass
MIN_CHUNK_ROWS = 64


def output_head(model: nn.Module) -> nn.Linear | None:
    """The model's output layer when it is a plain linear map applied last (HF causal LMs); None otherwise
    (a plain module returning logits, a LoRA-wrapped head, a final soft-cap after the head)."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    if type(head) is not nn.Linear:
        return None
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    if getattr(text, "final_logit_softcapping", None) is not None:
        return None
    return head


def chunk_rows(vocab: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    return max(MIN_CHUNK_ROWS, chunk_bytes // (4 * vocab))


def _rows_stats(hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor, temperature: float,
                entropy: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logprob of `targets` and (entropy != "none") the entropy for each row of `hidden` [N, H]; the same ops as
    `token_stats`'s full pass. entropy="grad" keeps the entropy's gradient."""
    logits = F.linear(hidden, head.weight, head.bias).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logprobs = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if entropy == "none":
        return logprobs, None
    with torch.set_grad_enabled(entropy == "grad" and torch.is_grad_enabled()):
        return logprobs, -(logp_all.exp() * logp_all).sum(-1)


def chunked_stats(hidden: torch.Tensor, head: nn.Linear, targets: torch.Tensor, temperature: float, entropy: str,
                  rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`_rows_stats` over `hidden` [N, H] in chunks of `rows`; under autograd each chunk is recomputed in the
    backward, so at most one chunk's logits are alive at any time."""
    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if entropy != "none" else None)
    parts = []
    for start in range(0, hidden.shape[0], rows):
        args = (hidden[start:start + rows], head, targets[start:start + rows], temperature, entropy)
        parts.append(checkpoint(_rows_stats, *args, use_reentrant=False) if torch.is_grad_enabled()
                     else _rows_stats(*args))
    logprobs = torch.cat([lp for lp, _ in parts])
    return logprobs, (torch.cat([ent for _, ent in parts]) if entropy != "none" else None)


def _graded_stats(states: torch.Tensor, head: nn.Linear, picks: torch.Tensor, graded: torch.Tensor | None,
                  temperature: float, entropy: str, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`chunked_stats`, with the rows that no loss term differentiates (`graded` False) outside autograd: their
    values only, no checkpointed recompute and no backward through the output layer. With no row graded all run
    under autograd: the caller's backward needs a graph (a step whose advantages are all 0 has a zero gradient)."""
    if graded is None or not torch.is_grad_enabled() or bool(graded.all()) or not bool(graded.any()):
        return chunked_stats(states, head, picks, temperature, entropy, rows)
    keep, rest = graded.nonzero()[:, 0], (~graded).nonzero()[:, 0]
    lp_keep, ent_keep = chunked_stats(states[keep], head, picks[keep], temperature, entropy, rows)
    with torch.no_grad():
        lp_rest, ent_rest = chunked_stats(states[rest], head, picks[rest], temperature, entropy, rows)

    def join(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a.new_zeros(len(picks)).index_put((keep,), a).index_put((rest,), b)
    return join(lp_keep, lp_rest), (None if ent_keep is None else join(ent_keep, ent_rest))


def _stand_in(head: nn.Linear, targets: torch.Tensor, positions: torch.Tensor, temperature: float, entropy: str,
              rows: int, sources: torch.Tensor | None = None, graded: torch.Tensor | None = None):
    """The output layer's forward for one pass: hidden states [B, T, H] to [B, T, 2] (logprob of the next token,
    entropy; 0 at the last position and wherever `positions` [B, T-1] is False). With `sources` (shared prompts,
    hybrid_engines/prompt_sharing.py) the hidden states are the laid-out groups' and each read position's comes from
    its flat index there; the result is still the rows' [B, T, 2]. `graded` [B, T-1]: the read positions whose
    numbers a loss differentiates (None: all); the others get their values without a gradient."""

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        where = positions.nonzero(as_tuple=True)
        wanted = targets[where]
        need = None if graded is None else graded[where].to(hidden.device)
        if sources is None:
            lp, ent = _graded_stats(hidden[:, :-1][where], head, wanted, need, temperature, entropy, rows)
        else:
            # a group's rows read their shared prompt at the same hidden states with the same next tokens (a client
            # that scores every position: the Tinker server): each distinct (state, target) pair runs the head once
            pairs, inverse = torch.unique(torch.stack([sources, wanted]), dim=1, return_inverse=True)
            if need is not None:  # a pair is differentiated when any of its positions is
                need = torch.zeros(pairs.shape[1], dtype=torch.int32, device=need.device).index_add_(
                    0, inverse, need.int()) > 0
            lp, ent = _graded_stats(hidden.reshape(-1, hidden.shape[-1])[pairs[0]], head, pairs[1], need,
                                    temperature, entropy, rows)
            lp, ent = lp[inverse], (None if ent is None else ent[inverse])
        out = torch.zeros(positions.shape[0], positions.shape[1] + 1, 2, dtype=torch.float32, device=hidden.device)
        stacked = torch.stack([lp, ent if ent is not None else torch.zeros_like(lp)], dim=-1)
        return out.index_put(where, stacked)

    return forward


@contextlib.contextmanager
def stats_head(model: nn.Module, head: nn.Linear, targets: torch.Tensor, positions: torch.Tensor,
               temperature: float, entropy: str, rows: int, sources: torch.Tensor | None = None,
               graded: torch.Tensor | None = None) -> Iterator[None]:
    """Inside: `model`'s output layer computes (logprob, entropy) per position instead of logits. The layer's
    own forward is swapped on the instance, so its parameters (tied, sharded, wrapped) stay where they are."""
    head.forward = _stand_in(head, targets, positions, temperature, entropy, rows,  # type: ignore[method-assign]
                             sources, graded)
    try:
        yield
    finally:
        del head.forward
