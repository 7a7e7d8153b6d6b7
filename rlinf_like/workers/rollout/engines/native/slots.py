"""Per-slot decode inputs and sampling parameters of the native engine's batch, as tensors updated in place."""

from __future__ import annotations

import torch

from rlinf_like.workers.rollout.engines.sampling import RowParams
from rlinf_like.workers.rollout.types import RolloutRequest


class SlotState:
    def __init__(self, slots: int, max_blocks: int, device: torch.device):
        self.table = torch.zeros(slots, max_blocks, dtype=torch.int64, device=device)  # block tables; 0: scratch
        self.last_token = torch.zeros(slots, dtype=torch.int64, device=device)
        self.position = torch.zeros(slots, dtype=torch.int64, device=device)
        self.temperature = torch.zeros(slots, device=device)
        self.top_k = torch.zeros(slots, dtype=torch.int64, device=device)
        self.top_p = torch.ones(slots, device=device)
        self.seed = torch.zeros(slots, dtype=torch.int64, device=device)
        self.step = torch.zeros(slots, dtype=torch.int64, device=device)

    def admit(self, slots: list[int], request: RolloutRequest, seeds: list[int]) -> None:
        s = request.sampling
        index = torch.tensor(slots, device=self.seed.device)
        self.temperature[index] = s.temperature
        self.top_k[index] = s.top_k
        self.top_p[index] = s.top_p
        self.seed[index] = torch.tensor(seeds, device=self.seed.device)
        self.step[index] = 0

    def params(self, rows) -> RowParams:
        return RowParams(self.temperature[rows], self.top_k[rows], self.top_p[rows], self.seed[rows], self.step[rows])

    def resume(self, slot: int, last_token: int, position: int, step: int) -> None:
        self.last_token[slot], self.position[slot], self.step[slot] = last_token, position, step

    def after_prefill(self, slots: list[int], tokens: torch.Tensor, lengths: torch.Tensor) -> None:
        """Each slot's first token, sampled after its prompt of `lengths` tokens, goes into the cache there next."""
        index = torch.tensor(slots, device=tokens.device)
        self.last_token[index] = tokens
        self.position[index] = lengths
        self.step[index] = 1

    def after_decode(self, rows: torch.Tensor, tokens: torch.Tensor) -> None:
        """The decoded rows (live slots, no repeats) move one position on."""
        self.last_token[rows] = tokens
        self.position[rows] += 1
        self.step[rows] += 1

    def release(self, slot: int) -> None:
        self.table[slot] = 0  # block 0: scratch, which no sequence owns
        self.position[slot] = 0
        self.last_token[slot] = 0
