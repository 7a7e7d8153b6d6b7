"""Training batches for language-model RL: prompt + response token rows, right-padded, with
per-token tensors aligned to `token_logprobs` (position t holds the prediction of token t + 1).

    batch = build_rl_batch(prompts, responses, rollout_logprobs, advantages)
    batch["input_ids"]      [N, L]     prompt then response, pad 0
    batch["attention_mask"] [N, L]
    batch["response_mask"]  [N, L-1]   1 where the predicted token is a response token
    batch["old_logprobs"]   [N, L-1]   the rollout's logprobs of those tokens (0 elsewhere)
    batch["advantages"]     [N, L-1]   the sequence's advantage on its response tokens
    batch["prompt_lengths"] [N]        the prompt's tokens (rows with equal prompts can share them in training:
                                       hybrid_engines/prompt_sharing.py)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Batch = dict[str, torch.Tensor]


def build_rl_batch(
    prompts: Sequence[Sequence[int]],
    responses: Sequence[Sequence[int]],
    logprobs: Sequence[Sequence[float]],
    advantages: Sequence[float],
    pad_id: int = 0,
    masks: Sequence[Sequence[int]] | None = None,
) -> Batch:
    """One right-padded row per sequence. `masks` (per sequence, per response token; None: all ones) marks the
    tokens the loss covers: a multi-turn response holds tool and user tokens the model did not write."""
    if not len(prompts) == len(responses) == len(logprobs) == len(advantages):
        raise ValueError("prompts, responses, logprobs and advantages need one entry per sequence")
    if masks is not None and len(masks) != len(prompts):
        raise ValueError(f"{len(masks)} masks for {len(prompts)} sequences")
    rows = len(prompts)
    width = max(len(p) + len(r) for p, r in zip(prompts, responses))
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros(rows, width, dtype=torch.long)
    response_mask = torch.zeros(rows, width - 1)
    old = torch.zeros(rows, width - 1)
    adv = torch.zeros(rows, width - 1)
    for i, (prompt, response, lp, a) in enumerate(zip(prompts, responses, logprobs, advantages)):
        if len(lp) != len(response):
            raise ValueError(f"sequence {i}: {len(response)} response tokens but {len(lp)} logprobs")
        p, r = len(prompt), len(response)
        input_ids[i, : p + r] = torch.tensor(list(prompt) + list(response), dtype=torch.long)
        attention[i, : p + r] = 1
        # token_logprobs position t predicts token t+1: the response occupies positions p-1 .. p+r-2
        if masks is None or not masks[i]:
            response_mask[i, p - 1 : p + r - 1] = 1
        elif len(masks[i]) != r:
            raise ValueError(f"sequence {i}: {r} response tokens but a mask of {len(masks[i])}")
        else:
            response_mask[i, p - 1 : p + r - 1] = torch.tensor(masks[i], dtype=torch.float32)
        old[i, p - 1 : p + r - 1] = torch.tensor(lp, dtype=torch.float32)
        adv[i, p - 1 : p + r - 1] = a
    return {"input_ids": input_ids, "attention_mask": attention, "response_mask": response_mask,
            "old_logprobs": old, "advantages": adv,
            "prompt_lengths": torch.tensor([len(p) for p in prompts], dtype=torch.long)}


def build_sft_batch(prompts: Sequence[Sequence[int]], targets: Sequence[Sequence[int]], pad_id: int = 0,
                    target_masks: Sequence[Sequence[int]] | None = None) -> Batch:
    """Supervised rows: loss only on the target tokens (`loss_mask`, aligned with input_ids); `target_masks`
    (per row, per target token) leaves out tokens the model is not to learn, e.g. a demonstration's tool output."""
    rows = len(prompts)
    width = max(len(p) + len(t) for p, t in zip(prompts, targets))
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros(rows, width, dtype=torch.long)
    loss_mask = torch.zeros(rows, width, dtype=torch.long)
    for i, (prompt, target) in enumerate(zip(prompts, targets)):
        p, t = len(prompt), len(target)
        input_ids[i, : p + t] = torch.tensor(list(prompt) + list(target), dtype=torch.long)
        attention[i, : p + t] = 1
        loss_mask[i, p : p + t] = 1 if target_masks is None else torch.tensor(target_masks[i], dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention, "loss_mask": loss_mask}


def read_mask(batch: Batch) -> torch.Tensor | None:
    """[B, T-1], aligned with `token_logprobs`: the positions a loss reads. `response_mask`, else `loss_mask` or
    `attention_mask` shifted to the predicted tokens; None when the batch has none (every position)."""
    if "response_mask" in batch:
        return batch["response_mask"]
    mask = batch.get("loss_mask", batch.get("attention_mask"))
    return mask[:, 1:] if mask is not None else None


def select_rows(batch: Batch, rows: torch.Tensor | slice) -> Batch:
    return {k: v[rows] for k, v in batch.items()}


def shard_rows(batch: Batch, rank: int, world_size: int) -> Batch:
    """This data-parallel rank's rows (contiguous, sizes differ by at most one)."""
    n = next(iter(batch.values())).shape[0]
    lo, hi = rank * n // world_size, (rank + 1) * n // world_size
    return select_rows(batch, slice(lo, hi))
