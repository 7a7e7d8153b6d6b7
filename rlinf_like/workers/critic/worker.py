"""CriticWorker: the PPO value model, a causal-LM backbone with a scalar head per token
(transformers' `*ForTokenClassification` with one label, initialised from the policy's checkpoint),
trained on a ModelManager by the same loop as the actor. Only [rows, tokens] values leave it.

Values are aligned with `token_logprobs`: position t holds V(tokens <= t), the state from which
token t + 1 is sampled, so `response_mask` selects exactly the states the policy acted in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from rlinf_like.algorithms import value_loss
from rlinf_like.data.batch import Batch, shard_rows
from rlinf_like.hybrid_engines.fsdp import FSDPConfig, FSDPModelManager
from rlinf_like.hybrid_engines.model_manager import LossFn, model_logits
from rlinf_like.workers.trained import TrainedWorker
from rlinf_like.training.loop import LoopConfig, LoopTerms, check_loop, micro_batches, micro_rows, train_epochs


@dataclass(kw_only=True)
class CriticConfig:
    model_path: str = ""  # a causal-LM checkpoint: its backbone is reused, the value head starts fresh
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)  # the actor's loop (actor.loop)
    loop_terms: LoopTerms = field(default_factory=LoopTerms)  # its seed and memory budget, as the run decides
    value_clip: float | None = 0.2  # PPO value clipping around the values the rollout was scored with


def token_values(model: nn.Module, batch: Batch) -> torch.Tensor:
    """V(s_t) for t = 0..T-2, shape [B, T-1], aligned with `token_logprobs`."""
    return model_logits(model, batch)[:, :-1, 0].float()  # a packed batch runs packed


def value_model_loss(clip: float | None) -> LossFn:
    """Clipped value loss on `returns` against `old_values`, over response tokens."""

    def loss_fn(model: nn.Module, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        values = token_values(model, batch)
        mask = batch["response_mask"]
        loss = value_loss(values, batch["old_values"], batch["returns"], mask, clip)
        error = ((values.detach() - batch["returns"]) ** 2 * mask).sum() / mask.sum().clamp(min=1)
        return loss, {"value_loss": float(loss.detach()), "value_mse": float(error)}

    return loss_fn


class CriticWorker(TrainedWorker):
    def __init__(self, config: CriticConfig):
        from transformers import AutoModelForTokenClassification

        check_loop(config.loop, "critic.loop")
        torch.manual_seed(config.loop_terms.seed + 1)
        self.config = config
        model = AutoModelForTokenClassification.from_pretrained(config.model_path, num_labels=1,
                                                                dtype=torch.float32)
        self.manager = FSDPModelManager(model, config.fsdp)
        self._loss = value_model_loss(config.value_clip)

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """Values of this rank's rows (the caller concatenates the ranks' parts in rank order)."""
        mine = shard_rows(batch, self.rank, self.world_size)
        rows = micro_rows(mine, self.config.loop, self.config.loop_terms.micro_batch_tokens)
        parts = [token_values(self.manager.model, m).cpu()  # the driver's batch lives on the host
                 for m in micro_batches(mine, rows)]
        return torch.cat(parts) if parts else torch.zeros(0, batch["input_ids"].shape[1] - 1)

    def train_step(self, batch: Batch) -> dict[str, float]:
        """PPO critic update on a batch with `returns`, `old_values` and `response_mask`."""
        metrics = train_epochs(self.manager, batch, self._loss, self.rank, self.world_size, self.config.loop,
                               terms=self.config.loop_terms)
        return {f"critic_{k}" if not k.startswith("value") else k: v for k, v in metrics.items()}
