"""RolloutWorker: one rank of the rollout group, wrapping the engine the config names.

Every rank of a tensor-parallel group runs the same calls (the group fans them out); rank 0
returns / streams the results. Weights arrive through the hybrid engine's weight sync:
`connect_weights` once per (actor, rollout) pair, then `apply_weights(version)` each step.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlinf_like.hybrid_engines.reshard import SyncPlan, TensorLayout
from rlinf_like.scheduler import Channel, Worker, control
from rlinf_like.workers.rollout.engine import RolloutConfig, make_engine
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult


class RolloutWorker(Worker):
    def __init__(self, config: RolloutConfig):
        group = self.process_group if self.world_size > 1 else None
        self.engine = make_engine(config, process_group=group, device=self.torch_device)

    def generate(self, requests: Sequence[RolloutRequest]) -> list[RolloutResult] | None:
        results = self.engine.generate(requests)
        return results if self.rank == 0 else None

    def generate_to(self, channel_name: str, requests: Sequence[RolloutRequest]) -> int:
        """Serve `requests`, putting each request's result on the channel as soon as its group is done
        (rank 0 only). Returns how many results were put."""
        if self.rank != 0:
            self.engine.generate(requests)
            return 0
        channel: Channel[RolloutResult] = Channel.connect(channel_name)
        self.engine.generate(requests, on_result=channel.put)
        return len(requests)

    @control
    def abort(self) -> None:
        """Stop the running generate: finished groups are kept, the rest come back partial ('abort')."""
        self.engine.abort()

    def offload(self) -> None:
        self.engine.offload()

    def onload(self) -> None:
        self.engine.onload()

    def weight_layouts(self) -> list[TensorLayout]:
        return self.engine.weight_layouts()

    def connect_weights(self, peer_group: str, plan: SyncPlan, transport: str = "group") -> None:
        self.engine.connect_weights(self.peer_group(peer_group), plan, self.rank, transport)

    def apply_weights(self, version: int, timeout_s: float | None = None) -> int:
        return self.engine.apply_weights(version, timeout_s)

    def version(self) -> int:
        return self.engine.version
