"""Sequence packing: the real tokens of right-padded rows [B, T] laid end to end in rows of at most
`max_batch_seqlen` tokens [R, W], so the model spends no compute on padding.

Every sequence restarts its position ids at 0. Models see the packed rows through `position_ids`
with no 2-D attention mask: transformers (>= 4.56; 5.x here) then detects the packing from the
position ids and builds the block-diagonal causal mask itself (sdpa / eager on CPU, any backend
on GPU); Megatron's `LogitsModule` builds the same mask from the same position ids. Per-token
results come back to the padded [B, T] (or [B, T-1]) layout, so losses, masks and advantages
never see the packed layout.

    packing = Packing.plan(batch["input_ids"], batch["attention_mask"], max_batch_seqlen=512)
    batch = {**batch, "packing": packing}   # token_logprobs / model_logits take the packed path
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Packing:
    max_batch_seqlen: int | None  # row budget it was planned with (None: the longest sequence)
    input_ids: torch.Tensor  # [R, W] packed tokens, 0 after each row's last sequence
    position_ids: torch.Tensor  # [R, W] 0.. per sequence (the row's tail counts from 0 too: its own block)
    lengths: torch.Tensor  # [B] real tokens per original row
    src: torch.Tensor  # [N] flat index into [B * T] of every real token
    dst: torch.Tensor  # [N] flat index into [R * W] where it sits packed
    batch_shape: tuple[int, int]  # (B, T)

    @classmethod
    def plan(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
             max_batch_seqlen: int | None = None) -> Packing:
        """First-fit decreasing of the sequences into rows of at most `max_batch_seqlen` tokens."""
        rows, width = input_ids.shape
        if attention_mask is None:
            lengths = torch.full((rows,), width, dtype=torch.long)
        else:
            mask = attention_mask.detach().to("cpu", torch.long)
            lengths = mask.sum(1)
            prefix = (torch.arange(width)[None] < lengths[:, None]).long()
            if not torch.equal(mask, prefix):
                bad = int((mask != prefix).any(1).nonzero()[0])
                raise ValueError(f"sequence packing needs right-padded rows (attention_mask a prefix of ones); "
                                 f"row {bad} is not")
        longest = int(lengths.max()) if rows else 0
        budget = longest if max_batch_seqlen is None else int(max_batch_seqlen)
        if budget < longest:
            raise ValueError(f"max_batch_seqlen={budget} is shorter than the longest sequence "
                             f"(row {int(lengths.argmax())}, {longest} tokens)")
        free: list[int] = []  # tokens left per packed row
        members: list[list[int]] = []
        for i in sorted(range(rows), key=lambda r: -int(lengths[r])):  # stable: ties keep row order
            n = int(lengths[i])
            if n == 0:
                continue
            slot = next((r for r, f in enumerate(free) if f >= n), None)
            if slot is None:
                free.append(budget)
                members.append([])
                slot = len(free) - 1
            free[slot] -= n
            members[slot].append(i)
        packed_width = max((budget - f for f in free), default=1)
        ids = torch.zeros(max(len(members), 1), packed_width, dtype=input_ids.dtype)
        positions = torch.zeros_like(ids, dtype=torch.long)
        src, dst = [], []
        for r, row in enumerate(members):
            offset = 0
            for i in sorted(row):  # original order inside a row
                n = int(lengths[i])
                src.append(torch.arange(n) + i * width)
                dst.append(torch.arange(n) + r * packed_width + offset)
                positions[r, offset:offset + n] = torch.arange(n)
                offset += n
            positions[r, offset:] = torch.arange(packed_width - offset)
        src_t = torch.cat(src) if src else torch.zeros(0, dtype=torch.long)
        dst_t = torch.cat(dst) if dst else torch.zeros(0, dtype=torch.long)
        ids.view(-1)[dst_t] = input_ids.detach().cpu().reshape(-1)[src_t]
        return cls(max_batch_seqlen, ids.to(input_ids.device), positions.to(input_ids.device), lengths,
                   src_t, dst_t, (rows, width)).to(input_ids.device)

    def to(self, device: torch.device | str) -> Packing:
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[key] = value.to(device)
        return Packing(**moved)

    @property
    def tokens(self) -> int:
        return int(self.src.numel())

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, ...] -> [R, W, ...] (zeros where no token sits)."""
        rows, width = self.input_ids.shape
        out = x.new_zeros(rows * width, *x.shape[2:])
        out[self.dst] = x.reshape(-1, *x.shape[2:])[self.src]
        return out.view(rows, width, *x.shape[2:])

    def unpack(self, x: torch.Tensor) -> torch.Tensor:
        """[R, W, ...] -> [B, T, ...] (zeros at padding); differentiable."""
        b, t = self.batch_shape
        flat = x.reshape(-1, *x.shape[2:])
        out = flat.new_zeros(b * t, *x.shape[2:]).index_copy(0, self.src, flat[self.dst])
        return out.view(b, t, *x.shape[2:])

    def unpack_next(self, x: torch.Tensor) -> torch.Tensor:
        """Next-token results [R, W-1, ...] (position j predicts packed token j+1) -> [B, T-1, ...]
        aligned with `token_logprobs`; positions whose next token is not in the same sequence are 0."""
        full = torch.cat([x, x.new_zeros(x.shape[0], 1, *x.shape[2:])], dim=1)
        out = self.unpack(full)[:, :-1]
        t = self.batch_shape[1]
        valid = torch.arange(t - 1, device=out.device)[None] < (self.lengths.to(out.device) - 1)[:, None]
        return out * valid.view(*valid.shape, *([1] * (out.dim() - 2))).to(out.dtype)


def pack_batch(batch: dict, max_batch_seqlen: int | None = None) -> dict:
    """The batch plus its packing plan under "packing" (per-token tensors stay padded)."""
    packing = Packing.plan(batch["input_ids"], batch.get("attention_mask"), max_batch_seqlen)
    return {**batch, "packing": packing}
