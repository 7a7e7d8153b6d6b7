"""Prompt sharing: the rows of a micro-batch that share a prompt (a GRPO group of n responses) laid out as one
sequence `[prompt, r1, ..., rn]`, so the prompt runs once, forward and backward, instead of n times.

Each response's position ids continue from the prompt's end, and a 4-D attention mask lets response i see the
prompt and its own past only, so every token sees exactly the tokens it sees in its own row. A response's first
token is predicted at the prompt's last position, which the n responses share: the output layer reads each row's
positions out of the laid-out hidden states with one gather (`SharedPrompts.sources`), whose backward sums the n
responses' gradients into the shared prompt. Per-row results come back in the batch's padded [B, T-1] layout, so
losses, masks and advantages never see the shared layout. The loss and its gradient are those of n separate rows,
up to float rounding (the "Prefix Grouper" layout, arXiv 2506.05433).

Rows are grouped by their prompt tokens (`prompt_lengths` from `build_rl_batch`), wherever they sit in the
micro-batch; a prompt with one response is laid out as its own row.

    shared = SharedPrompts.plan(batch["input_ids"], batch["attention_mask"], batch["prompt_lengths"])
    batch = {**batch, "shared_prompts": shared}   # token_stats takes the shared path
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

import torch
from torch import nn

from rlinf_like.utils.flops import ModelShape, cheaper_shared

# attention implementations that take a custom 4-D mask: SDPA (a boolean mask) and eager (an additive one)
MASKED_ATTENTION = ("sdpa", "eager")


@dataclass
class SharedPrompts:
    input_ids: torch.Tensor  # [G, S] per group: the prompt, then each response; 0 after the last
    position_ids: torch.Tensor  # [G, S] a response's positions continue from its prompt's end
    mask: torch.Tensor  # [G, 1, S, S] bool: query position i may attend to key position j
    source: torch.Tensor  # [B, T] flat index into [G * S] of where token t of row b sits; -1 at padding
    tokens: int  # real tokens laid out (a row's own count, less each group's repeated prompts)

    @classmethod
    def plan(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
             prompt_lengths: torch.Tensor) -> SharedPrompts:
        rows, width = input_ids.shape
        ids = input_ids.detach().cpu()
        lengths = (attention_mask.detach().cpu().long().sum(1) if attention_mask is not None
                   else torch.full((rows,), width))
        prompts = prompt_lengths.detach().cpu().long()
        members = group_members(group_ids({"input_ids": ids, "prompt_lengths": prompts}))
        spans = [int(prompts[g[0]]) + sum(int(lengths[b] - prompts[b]) for b in g) for g in members]
        span = max(spans, default=1)
        laid = torch.zeros(len(members), span, dtype=ids.dtype)
        positions = torch.zeros(len(members), span, dtype=torch.long)
        mask = torch.zeros(len(members), 1, span, span, dtype=torch.bool)
        source = torch.full((rows, width), -1, dtype=torch.long)
        for g, group in enumerate(members):
            p = int(prompts[group[0]])
            laid[g, :p] = ids[group[0], :p]
            positions[g, :p] = torch.arange(p)
            mask[g, 0, :p, :p] = torch.ones(p, p, dtype=torch.bool).tril()
            offset = p
            for b in group:
                r = int(lengths[b]) - p
                laid[g, offset:offset + r] = ids[b, p:p + r]
                positions[g, offset:offset + r] = torch.arange(p, p + r)
                mask[g, 0, offset:offset + r, :p] = True
                mask[g, 0, offset:offset + r, offset:offset + r] = torch.ones(r, r, dtype=torch.bool).tril()
                source[b, :p] = g * span + torch.arange(p)
                source[b, p:p + r] = g * span + offset + torch.arange(r)
                offset += r
            tail = torch.arange(offset, span)
            mask[g, 0, tail, tail] = True  # padding sees itself: no row of the mask is empty (SDPA gives NaN)
        device = input_ids.device
        return cls(laid.to(device), positions.to(device), mask.to(device), source.to(device), sum(spans))

    def to(self, device: torch.device | str) -> SharedPrompts:
        return SharedPrompts(**{f.name: (v.to(device) if isinstance(v := getattr(self, f.name), torch.Tensor) else v)
                                for f in fields(self)})

    def sources(self, positions: torch.Tensor) -> torch.Tensor:
        """For each read position (b, t) of `positions` [B, T-1] (row-major, as `nonzero` orders them): the flat
        index into the laid-out [G * S] hidden states of the token whose output predicts token t + 1 of row b."""
        picked = self.source[:, :-1][positions]
        if bool((picked < 0).any()):
            raise ValueError("a read position is padding: positions must be inside each row's tokens")
        return picked

    def attention_mask(self, model: nn.Module, dtype: torch.dtype) -> torch.Tensor:
        """The mask as `model`'s attention takes it: boolean for SDPA, additive (0 / dtype's min) for eager."""
        if attention_kind(model) == "sdpa":
            return self.mask
        return torch.zeros(self.mask.shape, dtype=dtype, device=self.mask.device).masked_fill(
            ~self.mask, torch.finfo(dtype).min)


def attention_kind(model: nn.Module) -> str | None:
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None)


def unsupported(model: nn.Module) -> str | None:
    """Why `model` cannot run shared prompts (None: it can): it needs an HF causal LM whose output layer is a plain
    linear map (`head_stats.output_head`), attention that takes a custom 4-D mask, and no sliding window (a window
    counts positions in the row, and the laid-out sequence is longer than any row)."""
    from rlinf_like.hybrid_engines.head_stats import output_head

    if output_head(model) is None:
        return "the model's output layer is not a plain linear map of an HF causal LM"
    if attention_kind(model) not in MASKED_ATTENTION:
        return f"attention {attention_kind(model)!r} takes no custom 4-D mask (supported: {list(MASKED_ATTENTION)})"
    config = getattr(model, "config", None)
    text = getattr(config, "text_config", None) or config
    if getattr(text, "sliding_window", None) and "sliding_attention" in (getattr(text, "layer_types", None) or []):
        return f"{type(model).__name__} has sliding-window layers"
    if getattr(text, "use_sliding_window", False):
        return f"{type(model).__name__} has sliding-window attention on"
    return None


def pair_cost(model: nn.Module) -> float:
    """`model`'s attention FLOPs per query-key pair over its other FLOPs per token (`utils/flops.py`): what a dense
    mask's extra pairs cost against the tokens sharing saves. 0 where the model has no HF config."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return 0.0
    return ModelShape.from_hf_config(config.to_dict()).pair_cost


def share_batch(batch: dict, pairs: float = 0.0) -> dict:
    """The batch plus its shared layout under "shared_prompts" (per-token tensors stay in the row layout), where
    that is the cheaper forward. SDPA on CPU computes every pair a mask covers, allowed or not, so a group laid out
    over S positions costs S + S^2 x `pairs` (a `pair_cost`) against T + T^2 x `pairs` for each of its padded rows:
    long responses make S^2 outgrow what the prompt's repeats cost, and the rows are kept (`pairs` 0: always share)."""
    shared = SharedPrompts.plan(batch["input_ids"], batch.get("attention_mask"), batch["prompt_lengths"])
    if pairs > 0 and not cheaper_shared(*shared.input_ids.shape, *batch["input_ids"].shape, pairs):
        return batch
    return {**batch, "shared_prompts": shared}


def group_ids(batch: dict) -> torch.Tensor:
    """[B] the index of each row's prompt among the batch's distinct prompts, in order of first appearance."""
    ids, prompts = batch["input_ids"].detach().cpu(), batch["prompt_lengths"].detach().cpu().long()
    seen: dict[tuple[int, ...], int] = {}
    return torch.tensor([seen.setdefault(tuple(ids[b, : int(prompts[b])].tolist()), len(seen))
                         for b in range(ids.shape[0])], dtype=torch.long)


def group_members(groups: torch.Tensor) -> list[list[int]]:
    """`group_ids`' answer as each group's rows, groups in order of first appearance."""
    return [(groups == g).nonzero()[:, 0].tolist() for g in range(int(groups.max()) + 1)] if len(groups) else []


def common_prefixes(rows: list[list[int]], pairs: float) -> list[int]:
    """Per row, the length of a prompt it shares, for rows that do not say where their prompt ends (a Tinker client's
    data): the grouping of the rows, sorted by their tokens, into runs laid out `[prefix, rest_1, ..., rest_n]` that
    costs least by `share_batch`'s rule (S + S^2 x `pairs` a laid-out sequence of S positions). So a GRPO group's
    samples share their prompt, and groups whose prompts only begin alike (a chat template, a few-shot example) stay
    apart, unless joining them costs less. A row alone keeps all but its last token as its prompt."""
    pairs = max(pairs, MIN_PAIR_COST)
    order = sorted(range(len(rows)), key=lambda i: rows[i])
    sizes = [len(rows[i]) for i in order]
    between = [len(os.path.commonprefix([rows[a], rows[b]])) for a, b in zip(order, order[1:])]
    best, cut = [0.0] + [float("inf")] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):  # best[end]: the cheapest grouping of the first `end` sorted rows
        shared, total = 1 << 30, 0
        for start in range(end - 1, -1, -1):  # the run order[start:end], laid out as one sequence of `span`
            total += sizes[start]
            if start < end - 1:
                shared = min(shared, between[start], sizes[start] - 1, sizes[end - 1] - 1)
                if shared < 1:
                    break  # runs that begin further back share nothing either
            span = total - (0 if start == end - 1 else shared * (end - start - 1))
            if best[start] + span + span * span * pairs < best[end]:
                best[end], cut[end] = best[start] + span + span * span * pairs, start
    prompts = [0] * len(rows)
    end = len(order)
    while end > 0:
        start = cut[end]
        run = order[start:end]
        prefix = sizes[start] - 1 if len(run) == 1 else min(*between[start:end - 1], min(sizes[start:end]) - 1)
        for i in run:
            prompts[i] = max(prefix, 1)
        end = start
    return prompts


# a query-key pair's cost is never 0 in attention: 0 from `pair_cost` means the model's shape is unknown, and with 0
# every run of rows sharing one first token would join into one sequence
MIN_PAIR_COST = 1e-4
