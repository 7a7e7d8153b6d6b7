"""ActorWorker: the trained policy, one data-parallel rank per worker, on a ModelManager.

Every rank receives the whole batch and trains on its own rows through `workers/training.py`,
the loop the critic shares. The same loop serves SFT warm-start (token NLL) and RL (`rl_loss`),
so there is one training loop for every algorithm, role and backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from rlinf_like.data.batch import Batch, shard_rows
from rlinf_like.hybrid_engines.fsdp import FSDPConfig, FSDPModelManager
from rlinf_like.hybrid_engines.model_manager import token_nll_loss
from rlinf_like.workers.actor.loss import LossConfig, rl_loss
from rlinf_like.hybrid_engines.packing import pack_batch
from rlinf_like.workers.trained import TrainedWorker
from rlinf_like.workers.training import LoopConfig, check_loop, loss_tokens, num_rows, run_steps, train_epochs


@dataclass
class ActorConfig:
    model_path: str = ""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)


def loss_weigh(loss: LossConfig):
    """What the RL loss averages over, which scales token-budget micro-batches: rows for
    `seq-mean-*` aggregations, loss tokens otherwise."""
    return num_rows if loss.policy.aggregation.startswith("seq-mean") else loss_tokens


class ActorWorker(TrainedWorker):
    def __init__(self, config: ActorConfig):
        from transformers import AutoModelForCausalLM

        check_loop(config.loop, "actor.loop")
        torch.manual_seed(config.loop.seed)
        self.config = config
        model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=torch.float32)
        self.manager = FSDPModelManager(model, config.fsdp)
        self._loss = rl_loss(config.loss)

    # --- training -------------------------------------------------------------------------------------
    def _train(self, batch: Batch, loss_fn, epochs: int, weigh=loss_tokens) -> dict[str, float]:
        return train_epochs(self.manager, batch, loss_fn, self.rank, self.world_size, self.config.loop, epochs,
                            weigh=weigh)

    def sft_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step of supervised warm-start (loss on `loss_mask` tokens)."""
        return self._train(batch, token_nll_loss, epochs=1)

    def train_step(self, batch: Batch) -> dict[str, float]:
        """RL update on a `build_rl_batch` batch (plus ref_logprobs when the KL term is on)."""
        return self._train(batch, self._loss, epochs=self.config.loop.epochs, weigh=loss_weigh(self.config.loss))

    def train_micro_batches(self, steps: list[list[tuple[Batch, float]]]) -> dict[str, float]:
        """RL update on micro-batches planned elsewhere (a `BatchResizer`'s `rank_steps` for this rank):
        per optimizer step, (micro-batch, loss scale) pairs, through the same loop as `train_step`."""
        return run_steps(self.manager, steps, self._loss)

    def set_lr(self, lr: float) -> None:
        """Switch the base learning rate (SFT warm-start and RL use different ones); the schedule
        keeps applying on top."""
        for group in self.manager.optimizer.param_groups:
            group["lr"] = group["initial_lr"] = lr
        self.manager.scheduler.base_lrs = [lr] * len(self.manager.optimizer.param_groups)

    def compute_logprobs(self, batch: Batch) -> torch.Tensor:
        """Trainer-side logprobs of this rank's rows (to correct for the rollout engine's)."""
        mine = shard_rows(batch, self.rank, self.world_size)
        if self.config.loop.pack_sequences:
            mine = pack_batch(mine, self.config.loop.max_batch_seqlen)
        return self.manager.compute_logprobs(mine, self.config.loss.temperature)
