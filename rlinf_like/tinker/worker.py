"""The actor a Tinker training client drives: our FSDP actor with LoRA, taking Tinker's losses (`losses.py`) and
Adam's settings with each optimizer step, as the client sends them."""

from __future__ import annotations

import torch

from rlinf_like.tinker.losses import Datum, loss_closure
from rlinf_like.workers.actor.worker import ActorWorker


class TinkerActor(ActorWorker):
    def tinker_forward_backward(self, data: list[Datum], loss_fn: str, config: dict,
                                forward_only: bool = False) -> tuple[list[dict], dict[str, float]]:
        """Per datum its target logprobs and per-token loss, and `loss:sum`; the gradient accumulates until
        `tinker_optim_step` (Tinker's chunked forward_backward calls add up)."""
        outputs: list[dict] = []
        # the actor's prompt sharing (`actor.loop.share_prompt`, auto resolved for its model) covers a client's data
        share = self.config.loop_terms.share_pair_cost if self.shares_prompts() else None
        loss = loss_closure(data, loss_fn, config, outputs, share)
        try:
            if forward_only:
                with torch.no_grad():
                    total, _ = loss(self.manager.model, {})
                value = float(total)
            else:
                value = self.manager.forward_backward({}, loss)["loss"]
        finally:
            self._release_heap()
        return outputs, {"loss:sum": value}

    def tinker_optim_step(self, adam: dict) -> dict[str, float]:
        """One Adam step with the client's settings (learning_rate, beta1, beta2, eps, weight_decay, grad_clip_norm:
        0 is no clipping), then the gradients are cleared."""
        for group in self.manager.optimizer.param_groups:
            group["betas"] = (adam.get("beta1", 0.9), adam.get("beta2", 0.95))
            group["eps"] = adam.get("eps", 1e-12)
            group["weight_decay"] = adam.get("weight_decay", 0.0)
        self.manager.set_base_lr(adam["learning_rate"])
        self.manager.config.optim.clip_grad = adam.get("grad_clip_norm") or None
        metrics = self.manager.optim_step()
        return {f"{k}:mean": float(v) for k, v in metrics.items()}

    def sampler_adapters(self) -> dict[str, torch.Tensor] | None:
        """The adapters (sync names, whole) at rank 0: a sampler that holds the base weights serves the trained
        model from them, a few MB instead of the merged weights."""
        return self.manager.adapter_weights()
