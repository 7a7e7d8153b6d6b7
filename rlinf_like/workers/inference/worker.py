"""InferenceWorker: a frozen model that returns per-token logprobs (the KL reference, or old-policy
logprobs recomputed by the trainer's numerics). Only [rows, tokens] logprobs leave the worker,
never logits. Data parallel: each rank scores its own rows; the caller concatenates in rank order.
"""

from __future__ import annotations

import torch

from rlinf_like.data.batch import Batch, shard_rows
from rlinf_like.hybrid_engines.model_manager import token_logprobs
from rlinf_like.hybrid_engines.packing import pack_batch
from rlinf_like.hybrid_engines.residency import ResidencyManager
from rlinf_like.scheduler import Worker
from rlinf_like.workers.training import micro_batches


class InferenceWorker(Worker):
    def __init__(self, model_path: str, micro_batch_size: int | None = 64, temperature: float = 1.0,
                 pack_sequences: bool = False, max_batch_seqlen: int | None = None):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(self.torch_device).eval()
        self.model.requires_grad_(False)
        self.micro_batch_size, self.temperature = micro_batch_size, temperature
        self.pack_sequences, self.max_batch_seqlen = pack_sequences, max_batch_seqlen
        self.residency = ResidencyManager(self.model)

    @torch.inference_mode()
    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        mine = shard_rows(batch, self.rank, self.world_size)
        parts = []
        for micro in micro_batches(mine, self.micro_batch_size):  # None: the shard in one pass
            micro = {k: v.to(self.torch_device) for k, v in micro.items()}
            if self.pack_sequences:  # no compute on padding; logprobs come back padded
                micro = pack_batch(micro, self.max_batch_seqlen)
            parts.append(token_logprobs(self.model, micro, self.temperature).cpu())
        return torch.cat(parts) if parts else torch.zeros(0, batch["input_ids"].shape[1] - 1)

    def offload(self) -> None:
        self.residency.offload(["params"])

    def onload(self) -> None:
        self.residency.onload(["params"])
