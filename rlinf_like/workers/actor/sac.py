"""SACActorWorker: the SAC learner as a worker. Per round it takes the batches the replay worker serves on a
channel and runs one update per batch (`SACLearner`); it publishes the actor's weights to the rollout through
the same weight sync as PPO's actor (only the actor: the critics never leave this process). `build` makes the
learner (`SACLearner`, or `DiscreteSACLearner` for algorithm.name=discrete_sac)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from rlinf_like.hybrid_engines.reshard import SyncPlan, TensorLayout, WeightSender, replicated
from rlinf_like.models.policy_base import use_generator
from rlinf_like.runtime import Channel, Worker
from rlinf_like.workers.actor.sac_learner import SoftLearner


class SACActorWorker(Worker):
    def __init__(self, build: Callable[[], SoftLearner], seed: int = 0):
        if self.world_size != 1:
            raise ValueError(f"{self.name}: SAC trains on one actor rank; "
                             f"cluster.component_placement.actor places {self.world_size}")
        torch.manual_seed(seed)  # the rollout builds the same initial actor from this seed
        self.learner = build()
        # the learner's sampling (the actor's reparameterised draws) from its own generator, not torch's global one
        self.generator = torch.Generator().manual_seed(seed + 1)
        use_generator(self.learner.policy, self.generator)
        self._sender: WeightSender | None = None

    # --- weights to the rollout ----------------------------------------------------------------------
    def _synced(self) -> dict[str, torch.Tensor]:
        return dict(self.learner.policy.named_parameters())

    def weight_layouts(self) -> list[TensorLayout]:
        return [replicated(n, tuple(p.shape), 1, str(p.dtype)) for n, p in self._synced().items()]

    def adapter_spec(self) -> None:
        return None

    def changing_tensors(self) -> None:
        return None

    def connect_weights(self, peer_group: str, plan: SyncPlan, transport: str = "group") -> None:
        self._sender = WeightSender(self.peer_group(peer_group), plan, self.rank, transport)

    def publish_weights(self, version: int) -> int:
        if self._sender is None:
            raise RuntimeError(f"{self.name}: publish_weights before connect_weights")
        return self._sender.publish(version, {k: v.detach() for k, v in self._synced().items()})

    # --- training ------------------------------------------------------------------------------------
    def train(self, channel: str, count: int) -> dict[str, float]:
        """`count` updates, one per batch taken from `channel` (the replay worker's `serve`)."""
        source, done, metrics = Channel.connect(channel), 0, []
        while done < count:
            for batch in source.get().batches:
                metrics.append(self.learner.update(batch))
                done += 1
        return {k: float(np.mean([m[k] for m in metrics])) for k in metrics[0]} if metrics else {}

    # --- checkpoints ---------------------------------------------------------------------------------
    def save(self, path: str) -> None:
        torch.save({"learner": self.learner.state_dict(), "torch_rng": self.generator.get_state()}, path)

    def load(self, path: str) -> None:
        state = torch.load(path, weights_only=False)
        self.learner.load_state_dict(state["learner"])
        self.generator.set_state(state["torch_rng"])
