"""Score shaping for learned rewards (torchtune's PPO recipe): penalty rules and whitening.

A learned score is unbounded, so subtracting a constant cannot outweigh it: a penalised response's
score is *replaced* by a fixed penalty value, as torchtune does. Penalised are responses that did not
end with EOS (truncated at the length limit) and responses shorter than a minimum length. Pure
tensor functions over a batch of responses.
"""

from __future__ import annotations

import torch


def penalty_mask(finished: torch.Tensor, lengths: torch.Tensor, penalise_no_eos: bool,
                 min_response_tokens: int) -> torch.Tensor:
    """[N] bool: True for responses that get the penalty. `finished` [N] bool (ended with EOS / a stop
    token), `lengths` [N] response tokens."""
    mask = torch.zeros(finished.shape, dtype=torch.bool)
    if penalise_no_eos:
        mask |= ~finished.bool()
    if min_response_tokens > 0:
        mask |= lengths < min_response_tokens
    return mask


def apply_penalty(scores: torch.Tensor, mask: torch.Tensor, value: float) -> torch.Tensor:
    """Scores with the penalised entries replaced by `value` (a new tensor)."""
    return torch.where(mask, torch.full_like(scores, value), scores)


def whiten(values: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over all entries (population variance); with shift_mean=False
    the mean is added back, so only the scale changes (torchtune's option for rewards)."""
    mean, var = values.mean(), values.var(unbiased=False)
    out = (values - mean) * torch.rsqrt(var + eps)
    return out + mean if not shift_mean else out
