"""InferenceWorker: a frozen model that returns per-token logprobs (the KL reference, or old-policy
logprobs recomputed by the trainer's numerics). Only [rows, tokens] logprobs leave the worker,
never logits. Data parallel: each rank scores its own rows; the caller concatenates in rank order.
With `megatron` set, the model is split like a Megatron actor (TP x PP ranks per replica, the same
numerics as the actor's forward): a replica's ranks score the same rows and only its first rank
returns them, so the concatenation still holds each row once, in batch order.
"""

from __future__ import annotations

import torch

from rlinf_like.data.batch import Batch, shard_rows
from rlinf_like.hybrid_engines.megatron import MegatronConfig  # the config only: megatron is imported lazily
from rlinf_like.hybrid_engines.model_manager import token_logprobs
from rlinf_like.hybrid_engines.packing import pack_batch
from rlinf_like.hybrid_engines.prompt_sharing import pair_cost, share_batch
from rlinf_like.hybrid_engines.residency import ResidencyManager, turn_moves
from rlinf_like.runtime import Worker
from rlinf_like.training.loop import LoopConfig, micro_batches, resolve_share_prompt
from rlinf_like.utils import hardware


class InferenceWorker(Worker):
    def __init__(self, model_path: str, micro_batch_size: int | None = 64, temperature: float = 1.0,
                 pack_sequences: bool = False, max_batch_seqlen: int | None = None,
                 megatron: MegatronConfig | None = None, precision: str = "fp32", share_prompt: str = "false"):
        """`precision`: the actor's (auto | bf16 | fp32), so a KL reference shares its numerics: bf16 runs the
        forward under autocast, as the CPU actor does (utils/hardware.py decides auto). `share_prompt`: the
        actor's `loop.share_prompt`; rows of one prompt in a micro-batch then run it once (auto: where the model
        can, hybrid_engines/prompt_sharing.py)."""
        self.micro_batch_size, self.temperature = micro_batch_size, temperature
        if precision == "auto":
            precision = hardware.auto_precision(torch.device(self.torch_device))[0]
        self.autocast = precision == "bf16"
        self.pack_sequences, self.max_batch_seqlen = pack_sequences, max_batch_seqlen
        self.manager = None
        if megatron is not None:
            from rlinf_like.hybrid_engines.megatron import MegatronModelManager  # raises naming [megatron] if missing

            self.manager = MegatronModelManager(model_path, megatron)  # its optimizer is never stepped
            self.residency = self.manager.residency
            return
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).to(self.torch_device).eval()
        self.model.requires_grad_(False)
        self.residency = ResidencyManager(self.model)
        loop = resolve_share_prompt(LoopConfig(share_prompt=share_prompt, pack_sequences=pack_sequences,
                                               max_batch_seqlen=max_batch_seqlen), self.model)
        self.share_pairs = pair_cost(self.model) if loop.share_prompt == "true" else None

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        if self.manager is not None:  # megatron's schedules run under no_grad, not inference mode
            return self.manager.replica_logprobs(batch, self.temperature, self.pack_sequences, self.max_batch_seqlen)
        return self._hf_logprobs(batch)

    @torch.inference_mode()
    def _hf_logprobs(self, batch: Batch) -> torch.Tensor:
        mine = shard_rows(batch, self.rank, self.world_size)
        parts = []
        for micro in micro_batches(mine, self.micro_batch_size):  # None: the shard in one pass
            micro = {k: v.to(self.torch_device) for k, v in micro.items()}
            if self.share_pairs is not None and "prompt_lengths" in micro:  # each prompt once for its rows here
                micro = share_batch(micro, self.share_pairs)
            elif self.pack_sequences:  # no compute on padding; logprobs come back padded
                micro = pack_batch(micro, self.max_batch_seqlen)
            with torch.autocast(torch.device(self.torch_device).type, dtype=torch.bfloat16, enabled=self.autocast):
                parts.append(token_logprobs(self.model, micro, self.temperature).cpu())
        return torch.cat(parts) if parts else torch.zeros(0, batch["input_ids"].shape[1] - 1)

    def offload(self, force: bool = False) -> int:
        """Hand the device to a collocated peer; returns the bytes moved: 0 on CPU unless `force` (`turn_moves`)."""
        if not turn_moves(self.torch_device, force):
            return 0
        return sum(move.bytes for move in self.residency.offload(["params"]))

    def onload(self) -> int:
        return sum(move.bytes for move in self.residency.onload(["params"]))
