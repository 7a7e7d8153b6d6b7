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
from typing import Literal

import torch

from rlinf_like.config.validate import bounded
from rlinf_like.hybrid_engines.lora_sync import AdapterMerger, AdapterSpec
from rlinf_like.hybrid_engines.reshard import SyncPlan, TensorLayout, WeightReceiver
from rlinf_like.utils import hardware
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult

ResultCallback = Callable[[RolloutResult], None]
# serve(): called with whether the engine is idle; new requests ([] for none now), or None once closed
RequestSource = Callable[[bool], "list[RolloutRequest] | None"]


LOGPROB_SOURCES = ("sampled", "rescored")  # rescored: engines declaring rescored_logprobs


def rollout_dtype(dtype: str, device: str) -> tuple[str, str]:
    """(the torch dtype name `rollout.dtype` means on `device`, why): `auto` asks the hardware."""
    if dtype != "auto":
        return dtype, "set in the config"
    precision, why = hardware.auto_precision(torch.device(device))
    return ("bfloat16" if precision == "bf16" else "float32"), why


@dataclass(kw_only=True)
class RolloutConfig:
    """The rollout engine's config, and the reasoning schema's `rollout` section as it is."""

    engine: str = "native"  # a name in ENGINE_REGISTRY (workers/rollout/engine.py): native | hf | sglang | vllm
    model_path: str = ""  # the checkpoint served; empty in a runner's config: the run's model
    max_batch_size: int = bounded(128, ge=1)  # continuous-batching slots per engine (sequences decoded together)
    # ranks per engine; the rollout group holds world / tp_size data-parallel replicas (0: one engine over all)
    tp_size: int = bounded(1, ge=0)
    max_context: int = bounded(0, ge=0)  # prompt + response tokens; 0: the model's max_position_embeddings
    # native: the paged KV cache's memory budget per engine rank in GiB; 0: kv_cache_memory_fraction of free memory
    kv_cache_memory_gb: float = bounded(0.0, ge=0)
    # native, when kv_cache_memory_gb is 0: the share of the memory free at start-up (host RAM, or the GPU's) for the KV cache
    kv_cache_memory_fraction: float = bounded(0.1, gt=0, le=1)
    kv_block_size: int = bounded(16, ge=1)  # native: tokens per KV cache block (sequences take blocks as they grow)
    # native: keep finished sequences' full KV blocks (keyed by their tokens) for later prompts that start with them
    # (multi-turn: each turn prefills only what is new); dropped when the weights change. The same tokens and
    # logprobs within float rounding (as batching already gives); false: every prompt prefilled whole
    prefix_cache: bool = True
    # the rollout's weights and KV cache; a weight sync converts to it once, at the sender. auto: bfloat16 on a GPU
    # or a CPU with bf16 units (avx512_bf16, amx_bf16), else float32 (`rollout_dtype`); in a training run, float32
    # whenever the actor trains in fp32, so the exact on-policy path stays whole
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    # native, float32 on CPU: the decode step's linear layers. exact: F.linear's bits (the on-policy checks and the
    # golden runs compare bits); onednn: oneDNN's prepacked matmul, 2.4-3.5x faster at decode shapes on an AMD Zen 4
    # host (MKL's sgemm is slow there), logprobs within ~1e-6 relative of exact (native/packed.py)
    fp32_kernels: Literal["exact", "onednn"] = "exact"
    # native, on a GPU: decode steps replayed as CUDA graphs on bucketed batch sizes and spans, captured at start-up
    # (native/graphs.py); no effect on CPU. Off until a GPU run has checked it (tests/test_static_decode.py's gpu test)
    cuda_graphs: bool = False
    seed: int = 0  # sampling seed of requests that carry none (training requests carry their own)
    # "sampled": from the decode step; "rescored": one pass over prompt + response, the same floats whatever the batch
    logprobs: Literal[LOGPROB_SOURCES] = "sampled"
    # mixture-of-experts models, engines declaring returns_routes (native): each sample's routes, the top-k experts
    # every MoE layer ran each prompt and response token through, kept from the prefill and decode steps that
    # sampled it (so every prompt is computed whole: no prefix cache). actor.routing_replay=R3 turns it on
    return_routes: bool = False
    sglang_mem_fraction: float = bounded(0.5, gt=0, le=1)  # sglang: share of GPU memory for weights + KV cache


class RolloutEngine(ABC):
    # What the engine can do, declared by each engine; config checks read these (see engine.py).
    supports_tp = False  # one engine over a process group of several ranks (rollout.tp_size > 1)
    continues_migrated = False  # finishes requests another engine stopped half-way (`continuation`)
    rescored_logprobs = False  # rollout.logprobs=rescored: one pass over prompt + response after decoding
    returns_routes = False  # rollout.return_routes: each token's mixture-of-experts routes (RolloutResult.routes)
    needs_gpu = False
    serves_continuously = False  # `serve`: requests join while others decode, weights change between steps
    # runs only the model families implemented here (models/families), not any transformers architecture
    implements_families = False
    extra_module: str | None = None  # the optional package the engine is built on (its extra), e.g. "vllm"
    # non-empty: this is the recommended engine for real checkpoints on CPU, and why, as measured (engine_advice.py)
    cpu_real_model_choice = ""

    @classmethod
    def create(cls, config: RolloutConfig, process_group=None, tokenizer=None, device: str = "cpu") -> RolloutEngine:
        """Build from config; engines whose constructor takes fewer of these override it."""
        return cls(config, process_group=process_group, tokenizer=tokenizer, device=device)

    def __init__(self) -> None:
        self.version = 0
        self._abort = threading.Event()
        self._receiver: WeightReceiver | None = None
        self._merger: AdapterMerger | None = None  # LoRA: merges the adapters each round brings

    @abstractmethod
    def generate(self, requests: Sequence[RolloutRequest], on_result: ResultCallback | None = None) -> list[RolloutResult]:
        """Serve every request; `on_result` is called as each request's whole group finishes.
        Invalid requests come back with `error` set; the others are served."""

    def serve(self, source: RequestSource, on_result: ResultCallback, between_steps: Callable[[], None]) -> None:
        """Serve requests as `source` hands them over, until it is closed (engines that declare
        `serves_continuously`; runner.schedule=async needs it)."""
        raise NotImplementedError(f"{type(self).__name__} does not serve continuously")

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

    def load_adapters(self, spec: AdapterSpec, adapters: dict[str, torch.Tensor],
                      base: dict[str, torch.Tensor] | None = None) -> None:
        """Serve base + (B @ A) * scaling for LoRA `adapters` (sync names, whole tensors: one unsharded engine), as a
        weight sync's adapter round does, for a process that holds the adapters itself (the Tinker server's
        samplers). The base is `base` (a copy of the adapted weights kept by the caller, shared between engines),
        else this engine's weights at the first call."""
        if self._merger is None or self._merger.spec != spec:
            self._merger = AdapterMerger(spec, self.weight_tensors(), self.weight_layouts(), self._layout_rank(),
                                         base=base)
        for name, buffer in self._merger.buffers.items():
            buffer.copy_(adapters[name])
        self._merger.after_round(full=False)
        self._weights_changed()

    def adapter_base(self) -> dict[str, torch.Tensor] | None:
        """The base weights `load_adapters` merges onto (None before its first call)."""
        return None if self._merger is None else self._merger.base

    def connect_weights(self, group, plan: SyncPlan, rank: int, transport: str = "group",
                        adapters: AdapterSpec | None = None) -> None:
        """`adapters`: the actor trains LoRA and sends its adapters; this engine merges them (`lora_sync`)."""
        tensors = self.weight_tensors()
        self._merger = None
        if adapters is not None:
            self._merger = AdapterMerger(adapters, tensors, self.weight_layouts(), self._layout_rank())
            tensors = {**tensors, **self._merger.buffers}
        self._receiver = WeightReceiver(group, plan, rank, tensors, transport)

    def _layout_rank(self) -> int:
        """Which box of `weight_layouts()` this engine rank holds (its TP rank)."""
        return 0

    def apply_weights(self, version: int, timeout_s: float | None = None) -> int:
        if self._receiver is None:
            raise RuntimeError("apply_weights before connect_weights: no weight sync is set up")
        received = self._receiver.apply(version, timeout_s)
        if self._merger is not None:
            self._merger.after_round(full=self._receiver.last_round_full)
        self._weights_changed()
        self.version = version
        return received
