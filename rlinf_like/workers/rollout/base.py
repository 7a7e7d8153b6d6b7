"""The rollout engine interface (a leaf module: engines import it, the engine registry imports nothing of theirs).

Every engine takes `RolloutRequest`s and returns `RolloutResult`s, can give its memory back
(`offload` / `onload`), stop in-flight work (`abort`, from another thread), and receives new
weights through the hybrid engine's weight sync: it describes its weights as `TensorLayout`s
(`weight_layouts`), the actor's `WeightSender` publishes a version, and `apply_weights(version)`
writes it into `weight_tensors()` and then tells the engine (`_weights_changed`).
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from rlinf_like.hybrid_engines.reshard import SyncPlan, TensorLayout, WeightReceiver
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult

ResultCallback = Callable[[RolloutResult], None]


@dataclass
class RolloutConfig:
    engine: str = "native"
    model_path: str = ""
    max_batch_size: int = 64  # sequences decoded together (continuous-batching slots)
    tp_size: int = 0  # ranks per engine; the group holds world / tp_size replicas (0: one engine over all)
    max_context: int = 0  # prompt + response tokens; 0 = the model's max_position_embeddings
    dtype: str = "float32"
    seed: int = 0  # for requests without a seed
    logprobs: str = "sampled"  # "sampled": from the decode step; "rescored": one pass over prompt + response
    sglang_mem_fraction: float = 0.5  # sglang: share of GPU memory for weights + KV cache


class RolloutEngine(ABC):
    # What the engine can do, declared by each engine; config checks read these (see engine.py).
    supports_tp = False  # one engine over a process group of several ranks (rollout.tp_size > 1)
    continues_migrated = False  # finishes requests another engine stopped half-way (`continuation`)
    rescored_logprobs = False  # rollout.logprobs=rescored: one pass over prompt + response after decoding
    needs_gpu = False

    @classmethod
    def create(cls, config: RolloutConfig, process_group=None, tokenizer=None, device: str = "cpu") -> RolloutEngine:
        """Build from config; engines whose constructor takes fewer of these override it."""
        return cls(config, process_group=process_group, tokenizer=tokenizer, device=device)

    def __init__(self) -> None:
        self.version = 0
        self._abort = threading.Event()
        self._receiver: WeightReceiver | None = None

    @abstractmethod
    def generate(self, requests: Sequence[RolloutRequest], on_result: ResultCallback | None = None) -> list[RolloutResult]:
        """Serve every request; `on_result` is called as each request's whole group finishes.
        Invalid requests come back with `error` set; the others are served."""

    def abort(self) -> None:
        """Thread-safe: the running `generate` returns soon, unfinished samples partial with reason 'abort'
        (`continuation` turns them into requests another engine finishes). With no generate running it
        does nothing: the next generate starts by clearing it."""
        self._abort.set()

    @abstractmethod
    def offload(self) -> None:
        """Give weights and KV cache memory back (weights kept on host)."""

    @abstractmethod
    def onload(self) -> None: ...

    # --- weights -------------------------------------------------------------------------------------
    @abstractmethod
    def weight_layouts(self) -> list[TensorLayout]:
        """The engine's weights (HF names) as this rank holds them, for a `SyncPlan`."""

    @abstractmethod
    def weight_tensors(self) -> dict[str, torch.Tensor]:
        """Tensors a weight sync writes into (this rank's shards, or a staging copy)."""

    def _weights_changed(self) -> None:
        """Called after a sync wrote `weight_tensors()`; engines with private weights load them here."""

    def connect_weights(self, group, plan: SyncPlan, rank: int, transport: str = "group") -> None:
        self._receiver = WeightReceiver(group, plan, rank, self.weight_tensors(), transport)

    def apply_weights(self, version: int, timeout_s: float | None = None) -> int:
        if self._receiver is None:
            raise RuntimeError("apply_weights before connect_weights: no weight sync is set up")
        received = self._receiver.apply(version, timeout_s)
        self._weights_changed()
        self.version = version
        return received
