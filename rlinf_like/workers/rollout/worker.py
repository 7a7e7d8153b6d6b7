"""RolloutWorker: one rank of the rollout group, wrapping the engine the config names.

The group is `world_size / tp_size` data-parallel replicas of a `tp_size`-way tensor-parallel
engine (`rollout.tp_size`, default: the whole group is one TP engine). Every call fans out to
all ranks; each replica serves every `replicas`-th request, and each replica's first rank
returns / streams its results (`gather_results` puts them back in request order). Weights
arrive through the hybrid engine's weight sync: `connect_weights` once per (actor, rollout)
pair, then `apply_weights(version)` each step; every replica receives the full set.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rlinf_like.hybrid_engines.lora_sync import AdapterSpec, with_adapters
from rlinf_like.hybrid_engines.reshard import SyncPlan, TensorLayout
from rlinf_like.hybrid_engines.residency import turn_moves
from rlinf_like.runtime import Channel, Worker, control
from rlinf_like.workers.rollout.engine import RolloutConfig, make_engine
from rlinf_like.workers.rollout.engines.engine_advice import log_cpu_advice
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult

if TYPE_CHECKING:
    from rlinf_like.workers.rollout.agentic.agent_rollout import AgentSetup


def gather_results(per_rank: Sequence[list[RolloutResult] | None], requests: Sequence[RolloutRequest]):
    """The replica leaders' results, back in the order of `requests`."""
    by_id = {r.request_id: r for part in per_rank if part for r in part}
    return [by_id[q.request_id] for q in requests]


class RolloutWorker(Worker):
    def __init__(self, config: RolloutConfig, agent: AgentSetup | None = None):
        """`agent`: multi-turn mode (the `agent` section): each sample is an episode (`agent_rollout.py`)."""
        import torch.distributed as dist

        tp = config.tp_size or self.world_size
        if self.world_size % tp:
            raise ValueError(f"rollout.tp_size={tp} does not divide the rollout group's {self.world_size} ranks")
        self.tp, self.replicas, self.replica = tp, self.world_size // tp, self.rank // tp
        group = None
        if tp > 1 and self.replicas == 1:
            group = self.process_group
        elif tp > 1:  # every rank creates every replica's group, in the same order (a collective)
            groups = [dist.new_group(list(range(r * tp, (r + 1) * tp))) for r in range(self.replicas)]
            group = groups[self.replica]
        self.engine = make_engine(config, process_group=group, device=self.torch_device)
        if self.rank == 0:  # once per run: a real checkpoint on CPU names the recommended engine (no change made)
            log_cpu_advice(config, self.torch_device)
        self.agent = None
        if agent is not None:
            from rlinf_like.models import load_tokenizer
            from rlinf_like.workers.rollout.agentic.agent_rollout import AgentRollout

            self.agent = AgentRollout(self.engine, agent, load_tokenizer(config.model_path))
        # serving continuously (runner.schedule=async): what `submit` handed over, under the result key it names
        self._inbox: deque[tuple[RolloutRequest, str]] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._announced = 0  # the newest weight version announced by `update_weights`
        self._moved_out = False  # the engine was offloaded (on CPU only when forced)

    @property
    def is_leader(self) -> bool:
        return self.rank % self.tp == 0

    def _mine(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]:
        return list(requests[self.replica :: self.replicas])

    def generate(self, requests: Sequence[RolloutRequest]) -> list[RolloutResult] | None:
        """This replica's share of `requests`, served; its leader returns the results (see `gather_results`)."""
        results = self._generate(self._mine(requests))
        return results if self.is_leader else None

    def _generate(self, requests: Sequence[RolloutRequest]) -> list[RolloutResult]:
        return self.agent.generate(requests) if self.agent is not None else self.engine.generate(requests)

    def generate_to(self, channel_name: str, requests: Sequence[RolloutRequest]) -> int:
        """Serve this replica's share, its leader putting each request's result on the channel as soon as
        its group is done. Returns how many results this rank put."""
        return self.serve_to(channel_name, self._mine(requests))

    def serve_to(self, channel_name: str, requests: Sequence[RolloutRequest]) -> int:
        """Serve all of `requests` on this replica (the caller picked it: e.g. requests migrated here),
        streaming results like `generate_to`. Call it on one replica's ranks only."""
        if not self.is_leader:
            self.engine.generate(requests)
            return 0
        channel: Channel[RolloutResult] = Channel.connect(channel_name)
        if self.agent is not None:  # episodes end together: their groups go out as one
            for result in self.agent.generate(requests):
                channel.put(result)
        else:
            self.engine.generate(requests, on_result=channel.put)
        return len(requests)

    # --- serving continuously (runner.schedule=async; tp_size 1: every rank is a replica) -------------------
    def serve(self, channel_name: str) -> int:
        """Serve what `submit` hands over until `close_serving`, each finished group going onto the channel under
        the key it was submitted with. Weights announced by `update_weights` are received between decode steps,
        so samples in flight go on under them. Returns the groups served."""
        channel: Channel[RolloutResult] = Channel.connect(channel_name)
        keys: dict[str, str] = {}
        served = 0

        def source(idle: bool) -> list[RolloutRequest] | None:
            with self._wake:
                if idle and not self._inbox and not self._closed:
                    self._wake.wait(0.05)  # nothing to decode: sleep until a submit or an announcement
                taken = list(self._inbox)
                self._inbox.clear()
                if not taken and self._closed:
                    return None
            keys.update((request.request_id, key) for request, key in taken)
            return [request for request, _ in taken]

        def between_steps() -> None:
            if self._announced > self.engine.version:
                self.engine.apply_weights(self._announced)

        def on_result(result: RolloutResult) -> None:
            nonlocal served
            channel.put(result, key=keys.pop(result.request_id))
            served += 1

        with self._wake:
            self._closed = False
        if self.agent is not None:  # each request's samples are episodes; the groups go out as they finish
            def take() -> list[tuple[RolloutRequest, str]] | None:
                with self._wake:
                    if not self._inbox and not self._closed:
                        self._wake.wait(0.05)
                    taken = list(self._inbox)
                    self._inbox.clear()
                    return None if not taken and self._closed else taken

            return self.agent.serve(take, lambda result, key: channel.put(result, key=key), between_steps)
        self.engine.serve(source, on_result, between_steps)
        return served

    @control
    def submit(self, requests: Sequence[RolloutRequest], key: str) -> None:
        """Hand requests to the running `serve`; their results go onto its channel under `key`."""
        with self._wake:
            self._inbox.extend((request, key) for request in requests)
            self._wake.notify()

    @control
    def update_weights(self, version: int) -> None:
        """Announce weight version `version`: the running `serve` receives it before its next decode step (the
        actor's publish_weights completes then)."""
        with self._wake:
            self._announced = max(self._announced, version)
            self._wake.notify()

    @control
    def close_serving(self) -> None:
        """`serve` takes nothing more and returns once what it took is done (abort first to end those early)."""
        with self._wake:
            self._closed = True
            self._wake.notify()

    @control
    def abort(self) -> None:
        """Stop the running generate: finished groups are kept, the rest come back partial ('abort')."""
        self.engine.abort()

    def offload(self, force: bool = False) -> bool:
        """Hand the device to a collocated peer; returns whether the engine moved anything. Not on CPU unless
        `force` (`residency.turn_moves`): the weights and the native engine's KV cache (and its prefix cache) stay
        allocated from one step to the next."""
        if not turn_moves(self.torch_device, force, say=self.rank == 0):
            return False
        self.engine.offload()
        self._moved_out = True
        return True

    def onload(self) -> None:
        if self._moved_out or turn_moves(self.torch_device):  # on GPU every onload reaches the engine
            self.engine.onload()
            self._moved_out = False

    def weight_layouts(self, adapters: AdapterSpec | None = None) -> list[TensorLayout]:
        """The engine's TP layouts, repeated for every replica (group rank r holds TP rank r % tp's box); with
        `adapters` (LoRA in the actor) also the adapters this group receives and merges."""
        return [TensorLayout(l.name, l.shape, tuple(l.boxes[r % self.tp] for r in range(self.world_size)), l.dtype)
                for l in with_adapters(self.engine.weight_layouts(), adapters)]

    def connect_weights(self, peer_group: str, plan: SyncPlan, transport: str = "group",
                        adapters: AdapterSpec | None = None) -> None:
        self.engine.connect_weights(self.peer_group(peer_group), plan, self.rank, transport, adapters)

    def apply_weights(self, version: int, timeout_s: float | None = None) -> int:
        return self.engine.apply_weights(version, timeout_s)

    def version(self) -> int:
        return self.engine.version
