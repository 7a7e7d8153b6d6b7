"""ActorWorker: the trained policy on a ModelManager, FSDP (default) or Megatron (`backend`).

Every rank receives the whole batch and trains on its data-parallel replica's rows through
`training/loop.py`, the loop the critic shares. Under FSDP each rank is a replica; under
Megatron the TP x PP ranks of one replica see the same rows (`ModelManager.data_parallel`). The
same loop serves SFT warm-start (token NLL) and RL (`rl_loss`), so there is one training loop for
every algorithm, role and backend.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from rlinf_like.data.batch import Batch
from rlinf_like.hybrid_engines import routing_replay
from rlinf_like.hybrid_engines.model_manager import DataParallelRank, ModelManager, token_nll_loss
from rlinf_like.hybrid_engines.fsdp.lora import LoraConfig, check_lora
from rlinf_like.hybrid_engines.prompt_sharing import pair_cost
from rlinf_like.workers.actor.backends import BACKEND_REGISTRY, backend_class, backends_with
from rlinf_like.workers.actor.config import ActorConfig
from rlinf_like.workers.actor.loss import LossConfig, rl_loss
from rlinf_like.workers.trained import TrainedWorker
from rlinf_like.utils.heap import return_freed_memory
from rlinf_like.training.loop import (LoopConfig, check_loop, loss_tokens, num_rows, resolve_share_prompt, run_steps,
                                     sharing, train_epochs)

__all__ = ["ActorConfig", "ActorWorker", "build_manager", "check_actor_config", "loss_weigh"]


def check_actor_config(config: ActorConfig, owner: str = "actor") -> None:
    """What the chosen backend cannot do, refused by name before the model is built."""
    if config.backend not in BACKEND_REGISTRY:
        raise ValueError(f"{owner}.backend={config.backend!r} is not one of {BACKEND_REGISTRY.names()}")
    check_loop(config.loop, f"{owner}.loop")
    check_lora_support(config.backend, config.fsdp.lora, owner)
    check_share_support(config.backend, config.loop, owner)
    backend_class(config.backend).check(config, owner)


def check_share_support(backend: str, loop: LoopConfig, owner: str = "actor") -> None:
    """`loop.share_prompt=true` on a backend that does not declare `supports_shared_prompts` is refused by name."""
    if loop.share_prompt == "true" and not backend_class(backend).supports_shared_prompts:
        raise ValueError(f"{owner}.loop.share_prompt=true: {owner}.backend={backend} does not lay out shared prompts "
                         f"(backends that do: {backends_with('supports_shared_prompts')})")


def check_lora_support(backend: str, config: LoraConfig, owner: str = "actor") -> None:
    """LoRA on a backend that does not declare `supports_lora` (megatron) is refused by name."""
    check_lora(config, f"{owner}.lora")
    if config.enabled and not backend_class(backend).supports_lora:
        raise ValueError(f"{owner}.lora.rank={config.rank}: LoRA with {owner}.backend={backend} is not supported "
                         f"yet (backends with LoRA: {backends_with('supports_lora')})")


def build_manager(config: ActorConfig) -> ModelManager:
    """The manager `config.backend` names, on the HF checkpoint `config.model_path`."""
    return backend_class(config.backend).build_manager(config)


def loss_weigh(loss: LossConfig):
    """What the RL loss averages over, which scales token-budget micro-batches: rows for
    `seq-mean-*` aggregations, loss tokens otherwise."""
    return num_rows if loss.aggregation.startswith("seq-mean") else loss_tokens


class ActorWorker(TrainedWorker):
    def __init__(self, config: ActorConfig):
        check_actor_config(config)
        torch.manual_seed(config.loop_terms.seed)
        self.manager = build_manager(config)
        loop = resolve_share_prompt(config.loop, self.manager.model)
        terms = replace(config.loop_terms, share_pair_cost=pair_cost(self.manager.model)) \
            if loop.share_prompt == "true" else config.loop_terms
        self.config = replace(config, loop=loop, loop_terms=terms)
        self._loss = rl_loss(config.loss, config.loss_terms)
        # R2 and R3 force a batch's routes in every forward here (R3's recomputation replays the rollout's too; R2's
        # records the trainer's own, `compute_logprobs(routes=True)`)
        if config.loss_terms.routing_replay != "disabled":
            routing_replay.install(self.manager.model, replay=True)

    def shares_prompts(self) -> bool:
        """Whether RL batches train with each prompt run once for its samples (`loop.share_prompt`, auto resolved)."""
        return self.config.loop.share_prompt == "true"

    def data_parallel(self) -> DataParallelRank:
        """Which rows this rank trains on (a driver that plans micro-batches per rank asks this)."""
        return self.manager.data_parallel()

    # --- training -------------------------------------------------------------------------------------
    def _train(self, batch: Batch, loss_fn, epochs: int, weigh=loss_tokens) -> dict[str, float]:
        dp = self.manager.data_parallel()
        try:
            return train_epochs(self.manager, batch, loss_fn, dp.rank, dp.size, self.config.loop, epochs,
                                weigh=weigh, terms=self.config.loop_terms)
        finally:
            self._release_heap()

    def _release_heap(self) -> None:
        """A CPU rank's freed activations go back to the OS after each step (`utils/heap.py`: glibc holds them, and
        the resident memory Ray's monitor reads would climb step by step)."""
        if self.device.kind != "gpu":
            return_freed_memory()

    def sft_step(self, batch: Batch) -> dict[str, float]:
        """One optimizer step of supervised warm-start (loss on `loss_mask` tokens)."""
        return self._train(batch, token_nll_loss, epochs=1)

    def train_step(self, batch: Batch) -> dict[str, float]:
        """RL update on a `build_rl_batch` batch (plus ref_logprobs when the KL term is on)."""
        return self._train(batch, self._loss, epochs=self.config.loop.epochs, weigh=loss_weigh(self.config.loss))

    def train_micro_batches(self, steps: list[list[tuple[Batch, float]]]) -> dict[str, float]:
        """RL update on micro-batches planned elsewhere (the pipelined schedule's `plan_steps` for this rank's
        data-parallel rank): per optimizer step, (micro-batch, loss scale) pairs, through the same loop
        as `train_step`."""
        try:
            return run_steps(self.manager, steps, self._loss)
        finally:
            self._release_heap()

    def reference_logprobs(self, batch: Batch) -> torch.Tensor:
        """Under LoRA: the KL reference's logprobs, from the frozen base (adapters disabled) in this model;
        rows as `compute_logprobs` returns them. No second model is loaded."""
        with self.manager.adapters_disabled():  # the reference runs its own routes: no replay
            return self.compute_logprobs({k: v for k, v in batch.items() if k != "routes"})

    def set_lr(self, lr: float) -> None:
        """Switch the base learning rate (SFT warm-start and RL use different ones); the schedule
        keeps applying on top."""
        self.manager.set_base_lr(lr)

    def compute_logprobs(self, batch: Batch, by_length: bool = False,
                         routes: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Trainer-side logprobs of this replica's rows (to correct for the rollout engine's); the
        replica's other ranks return no rows (`ModelManager.replica_logprobs`). `by_length`: one unpadded
        forward per row length (`algorithm.recompute_by_length`). `routes` (R2 routing replay): also the
        experts this forward's routers chose, which the update then replays."""
        loop = self.config.loop
        return self.manager.replica_logprobs(batch, self.config.loss_terms.temperature, loop.pack_sequences,
                                             loop.max_batch_seqlen, by_length=by_length,
                                             share_pairs=(self.config.loop_terms.share_pair_cost
                                                          if sharing(loop, batch) and not routes else None),
                                             routes=routes)
