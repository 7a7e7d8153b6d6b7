"""Learned reward model: a sequence-classification model (transformers `*ForSequenceClassification`
with one label) whose score of a prompt + response is its head applied at the last non-padding token.

The last real token is found from the attention mask, not from `pad_token_id` (as HF's own pooling
does), so a pad id that also occurs as a real token (pad = EOS is common) cannot move it, and left
and right padding give the same scores; position ids count real tokens only, so a left-padded row
sees the positions it would see unpadded.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B] position of each row's last attended token (left or right padding)."""
    mask = attention_mask.bool()
    if not bool(mask.any(-1).all()):
        raise ValueError("reward model: a row has no tokens (attention_mask all zero)")
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    return torch.where(mask, positions, -1).amax(-1)


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions counted over real tokens, so padding on the left does not shift them."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def sequence_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[B] float32 scores of a `*ForSequenceClassification` model (num_labels=1) at each row's last
    real token. Runs the backbone and the head separately: the head sees only the gathered rows."""
    head = getattr(model, "score", None)
    if head is None or model.config.num_labels != 1:
        raise ValueError(f"reward model {type(model).__name__}: needs a sequence-classification model with a "
                         f"'score' head and num_labels=1 (has num_labels={model.config.num_labels})")
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask,
                      position_ids=position_ids(attention_mask)).last_hidden_state
    last = hidden[torch.arange(hidden.shape[0], device=hidden.device), last_token_index(attention_mask)]
    return head(last)[:, 0].float()


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows -> (input_ids, attention_mask), padded on `side` ("right" or "left")."""
    if side not in ("left", "right"):
        raise ValueError(f"padding side {side!r} is not one of ['left', 'right']")
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if side == "left" else slice(0, len(row))
        ids[i, span] = torch.tensor(list(row), dtype=torch.long)
        mask[i, span] = 1
    return ids, mask


class RewardModel:
    """A frozen reward model on one device, scoring token rows in micro-batches."""

    def __init__(self, path: str, micro_batch_size: int | None = 32, device: str = "cpu"):
        from transformers import AutoModelForSequenceClassification

        self.model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch.float32)
        self.model.to(device).eval().requires_grad_(False)
        self.micro_batch_size, self.device = micro_batch_size, device
        self.pad_id = self.model.config.pad_token_id or 0

    @torch.inference_mode()
    def score(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """[N] scores of prompt + response token rows."""
        parts = []
        size = self.micro_batch_size or max(len(rows), 1)  # None: all rows in one pass
        for i in range(0, len(rows), size):
            ids, mask = pad_rows(rows[i : i + size], self.pad_id)
            parts.append(sequence_scores(self.model, ids.to(self.device), mask.to(self.device)).cpu())
        return torch.cat(parts) if parts else torch.zeros(0)
