"""The embedded engine: continuous batching over a paged KV cache, optionally tensor parallel.

`max_batch_size` batch slots hold sequences being decoded; their keys and values live in the
paged cache (`paging.py`): blocks of `rollout.kv_block_size` tokens, as many as the memory budget
holds, each sequence taking a block when it grows into one (its block table maps positions to
blocks). A request (its n samples) is admitted when n slots are free and the blocks its prompt
fills are free, plus one block of headroom per sample: its prompt is prefilled once, the blocks
the prompt fills whole are shared by the n samples and the last, partial one copied into each, so
a GRPO group shares one prefill and most of its prompt's memory. Everything admitted in one round
is prefilled in one pass (`Decoder.prefill`). Every step decodes one token for the live slots
together; a finished sequence frees its slot at once, and the next request takes it while the
others keep decoding (the loop: `scheduler.py`). The cache is allocated once (at the first
generate after start-up or an onload) and reused.

**Prefix cache** (`rollout.prefix_cache`, `prefix_cache.py`): a finished (or preempted) sequence's
full blocks stay in the cache, indexed by the tokens they hold, until their blocks are needed
(least recently used first); a prompt that starts with cached blocks shares them and prefills only
the rest, so a multi-turn episode's next turn (the whole trajectory as its prompt) computes only
the new tokens. The cache is dropped when the weights change (`_check_weights`, each round).
`prefilled_tokens` and `prefix_hit_tokens` count what prefills computed and what they found.

When a step needs more new blocks than are free, the engine **preempts** the most recently
admitted sequences (frees their slots and blocks) until the rest fit, and re-admits them before
any new request once blocks are free again, recomputing their keys/values from prompt + tokens in
one prefill (vLLM's recompute preemption). A preempted sample continues with the noise it would
have drawn (the sampler is counter-based), so sampled tokens follow the same draws; the recomputed
keys/values may differ from the decoded ones in the last bits. The start-up check guarantees that
one sequence of `max_context` tokens fits, so the oldest sequence always makes progress.

On a GPU with `rollout.cuda_graphs`, decode steps run on static, bucketed buffers replayed as CUDA graphs
(`graphs.py`), captured whenever the KV cache is allocated; elsewhere each step is built as it comes, with the
decode mirror.

Under tensor parallelism every rank runs this same loop on the same requests (the worker group
fans the call out); sampling is a pure function of each sequence's seed (see `sampling.py`), so
all ranks pick the same tokens with no broadcast. Only an abort needs agreement: one small
all-reduce per step.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn

from rlinf_like.hybrid_engines.reshard import TensorLayout
from rlinf_like.hybrid_engines.residency import ResidencyManager
from rlinf_like.workers.rollout.base import RequestSource, ResultCallback, RolloutConfig, RolloutEngine
from rlinf_like.workers.rollout.engines.native.model import (
    Decoder,
    fuse_projections,
    kv_bytes_per_token,
    load_shards,
    model_config,
    weight_layouts,
)
from rlinf_like.workers.rollout.engines.native.graphs import StaticDecode
from rlinf_like.workers.rollout.engines.native.paging import cache_budget, plan_cache
from rlinf_like.workers.rollout.engines.native.prefix_cache import CachingBlockPool
from rlinf_like.workers.rollout.engines.native.scheduler import BatchLoop, LiveSample
from rlinf_like.workers.rollout.engines.sampling import Workspace
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult, rejected, request_error

log = logging.getLogger(__name__)


class _TensorBag(nn.Module):
    """Named tensors as module buffers, so the residency manager can move them in place."""

    def __init__(self, tensors: dict[str, torch.Tensor]):
        super().__init__()
        for i, tensor in enumerate(tensors.values()):
            self.register_buffer(f"t{i}", tensor)


class NativeEngine(RolloutEngine):
    supports_tp = True
    continues_migrated = True
    rescored_logprobs = True
    returns_routes = True
    serves_continuously = True
    implements_families = True

    def __init__(self, config: RolloutConfig, process_group=None, tokenizer=None, device: str = "cpu"):
        super().__init__()
        self.config = config
        self.model_cfg = model_config(config.model_path)
        self.dtype = getattr(torch, config.dtype)
        self.device = torch.device(device)
        tp = dist.get_world_size(process_group) if process_group is not None else 1
        self.tp_group = process_group if tp > 1 else None
        self.rank = dist.get_rank(process_group) if self.tp_group is not None else 0
        self.layouts = weight_layouts(self.model_cfg, tp, self.dtype)
        shards = load_shards(config.model_path, self.layouts, self.rank, self.dtype, self.model_cfg)
        fused = fuse_projections(self.model_cfg, {n: t.to(self.device) for n, t in shards.items()})
        self.weights = {layout.name: fused[layout.name] for layout in self.layouts}  # HF names (some are views)
        self.decoder = Decoder(self.model_cfg, fused, self.tp_group, fp32_onednn=config.fp32_kernels == "onednn")
        self.max_context = config.max_context or self.model_cfg.max_position_embeddings
        self.slots = config.max_batch_size
        budget, source = cache_budget(config.kv_cache_memory_gb, config.kv_cache_memory_fraction, self.device)
        if self.tp_group is not None:  # every rank must page alike: the smallest rank's budget
            agreed = torch.tensor([budget], dtype=torch.int64)
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=self.tp_group)
            budget, source = int(agreed[0]), source + ", smallest over TP ranks"
        self.cache_plan = plan_cache(budget=budget, source=source, block_size=config.kv_block_size,
                                     token_bytes=kv_bytes_per_token(self.model_cfg, tp, self.dtype),
                                     max_context=self.max_context, slots=self.slots)
        self.max_blocks = -(-self.max_context // config.kv_block_size)  # a block table's length
        self.preemptions = 0  # sequences preempted (for tests and metrics)
        self.prefilled_tokens = 0  # tokens run through a prefill (computed, not found in the prefix cache)
        self.prefix_hit_tokens = 0  # prompt tokens whose keys/values came from the prefix cache
        self._pool: CachingBlockPool | None = None  # the cache's blocks, kept from one call to the next
        self._weights_seen: tuple[int, ...] | None = None  # the weights' stamp the prefix cache holds
        self._weight_syncs = 0
        if self.rank == 0:
            log.info("native engine: %s; max_batch_size %d, max_context %d", self.cache_plan.describe(),
                     self.slots, self.max_context)
        self._tokenizer = tokenizer
        self._residency = ResidencyManager(_TensorBag(self.weights))
        self._rng = random.Random(config.seed)  # same on every TP rank, consumed in the same order
        self.sampler_workspace = Workspace()
        graphs = config.cuda_graphs and self.device.type == "cuda"
        if graphs and config.return_routes and self.model_cfg.is_moe_model:
            raise ValueError("rollout.return_routes with rollout.cuda_graphs: a replayed graph cannot hand its "
                             "routes back; set rollout.cuda_graphs=false")
        self.static = (StaticDecode(self.decoder, self.max_blocks, self.max_context, self.device, use_graphs=True)
                       if graphs else None)
        if graphs:  # captured now, so the first call runs at speed (the KV cache's addresses are in the graphs)
            self._block_pool()

    # --- weights / memory ------------------------------------------------------------------------------
    def weight_layouts(self) -> list[TensorLayout]:
        return self.layouts

    def weight_tensors(self) -> dict[str, torch.Tensor]:
        return self.weights

    def _layout_rank(self) -> int:
        return self.rank

    def offload(self) -> None:
        self._residency.offload(["params"])
        self.decoder.free_cache()
        self.sampler_workspace = Workspace()
        self._pool = None  # the prefix cache goes with the memory
        if self.static is not None:
            self.static.drop()

    def onload(self) -> None:
        self._residency.onload(["params"])

    def _weights_changed(self) -> None:
        self._weight_syncs += 1

    # --- the KV cache's blocks and the prefix cache ------------------------------------------------------
    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (between calls; the weights changing does it by itself)."""
        if self._pool is not None:
            self._pool.clear()

    def _block_pool(self) -> CachingBlockPool:
        """The pool a generate/serve call runs on: the cache is allocated at the first call (or after an
        offload) and its blocks, cached prefixes included, carry over between calls."""
        plan = self.cache_plan
        if self.decoder.k_cache is None:
            self.decoder.allocate_cache(plan.blocks, plan.block_size, self.dtype, self.device)
            self._pool = None
            if self.static is not None:
                started = time.perf_counter()
                count = self.static.warm(self.slots)
                log.info("native engine: %d decode graphs captured in %.1f s", count, time.perf_counter() - started)
        if self._pool is None or self._pool.in_use:  # a call that failed left blocks held: start afresh
            # routes are kept per sample, not per cached block: with return_routes every prompt is computed whole
            caching = self.config.prefix_cache and not self.config.return_routes
            self._pool = CachingBlockPool(plan.blocks, plan.block_size, caching)
        self._check_weights(self._pool)
        return self._pool

    def _check_weights(self, pool: CachingBlockPool) -> None:
        """Drop the prefix cache when the weights changed since it was filled: a new version, a weight sync, or
        (tp 1) any in-place write to a weight tensor (their version counters; under TP ranks could count writes
        differently and must page alike)."""
        stamp = (self.version, self._weight_syncs)
        if self.tp_group is None:
            stamp += (sum(t._version for t in self.weights.values()),)
        if stamp != self._weights_seen:
            pool.clear()
            self._weights_seen = stamp


    def decode_step(self, tokens: torch.Tensor, positions: torch.Tensor, table: torch.Tensor, batch_key: object,
                    span: int) -> torch.Tensor:
        """Logits of one decode step: on static buffers (CUDA graphs) when the engine has them, else the dynamic
        step with the decode mirror."""
        if self.static is not None:
            return self.static(tokens, positions, table, span)
        return self.decoder.decode(tokens, positions, table, batch_key=batch_key, span=span)

    # --- serving -----------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[RolloutRequest], on_result: ResultCallback | None = None) -> list[RolloutResult]:
        self._abort.clear()  # an abort that came after the last generate ended must not stop this one
        if self._residency.is_offloaded("params"):
            raise RuntimeError("native engine: generate() while offloaded; call onload() first")
        results: list[RolloutResult] = []
        queue: deque[int] = deque()
        for request in requests:
            self._accept(request, results, queue, on_result)
        if queue:
            BatchLoop(self, list(requests), results, queue, on_result).run(None, None)
        return results

    def serve(self, source: RequestSource, on_result: ResultCallback, between_steps: Callable[[], None]) -> None:
        """Serve requests as they come, with no batch boundary, until `source` says it is closed and every
        request taken is done. `source(idle)` hands over new requests ([] for none now, None once closed; it may
        block a little when `idle`); it is asked only while no taken request waits for admission, so requests
        stay with the caller until there is room. `between_steps` runs before every decode step (and while idle):
        the place to apply new weights, so samples in flight go on under them (a partial rollout; each token's
        version is in `RolloutResult.token_versions`)."""
        self._abort.clear()
        if self._residency.is_offloaded("params"):
            raise RuntimeError("native engine: serve() while offloaded; call onload() first")
        if self.tp_group is not None:
            raise RuntimeError("native engine: serve() needs a tp_size 1 engine (replicas agree on no request order)")
        BatchLoop(self, [], [], deque(), on_result).run(source, between_steps)

    def _accept(self, request: RolloutRequest, results: list[RolloutResult], queue: deque[int],
                on_result: ResultCallback | None) -> bool:
        """Check `request` and add its result slot: queued when it has samples to generate (returns True),
        answered at once when it is rejected or already done."""
        i = len(results)
        error = request_error(request, self.max_context, self.slots) or self._budget_error(request)
        if error is not None:
            results.append(rejected(request, error, self.version))
            if on_result is not None:
                on_result(results[-1])
            return False
        n = request.n
        results.append(RolloutResult(request.request_id, list(request.prompt_ids), [[] for _ in range(n)],
                                     [[] for _ in range(n)], [""] * n, self.version, token_versions=[[] for _ in range(n)]))
        for j, progress in enumerate(request.progress):
            if progress.done:  # finished where it started: kept as it is
                results[-1].response_ids[j], results[-1].logprobs[j] = list(progress.tokens), list(progress.logprobs)
                results[-1].finish_reasons[j] = progress.finish_reason
                results[-1].token_versions[j] = [self.version] * len(progress.tokens)  # made elsewhere: unknown
        if request.unfinished():
            queue.append(i)
            return True
        if on_result is not None:
            on_result(results[-1])
        return False

    def _admission_blocks(self, request: RolloutRequest) -> int:
        """Blocks a request takes when admitted: a fresh one's prompt blocks (full ones shared by its samples),
        a continued one's largest sample (its samples are resumed one by one)."""
        bs = self.cache_plan.block_size
        if request.progress:
            return max(-(-(len(request.prompt_ids) + max(len(p.tokens) - 1, 0)) // bs)
                       for p in request.progress if not p.done)
        full, partial = divmod(len(request.prompt_ids), bs)
        return full + request.n * (partial > 0)

    def _budget_error(self, request: RolloutRequest) -> str | None:
        need, have = self._admission_blocks(request), self.cache_plan.blocks - 1
        if need > have:
            return (f"request {request.request_id!r}: its prompt needs {need} KV cache blocks for n={request.n}, "
                    f"the budget holds {have}; raise rollout.kv_cache_memory_gb or lower n")
        return None

    def _new_sequence(self, index: int, sample_index: int, request: RolloutRequest, order: int) -> LiveSample:
        s = request.sampling
        stop_ids = set(s.stop_token_ids) | (set() if s.ignore_eos else set(self.model_cfg.eos_token_ids))
        progress = request.progress[sample_index] if request.progress else None
        return LiveSample(index, sample_index, len(request.prompt_ids), frozenset(stop_ids), tuple(s.stop_strings),
                     s.max_new_tokens, list(progress.tokens) if progress else [],
                     list(progress.logprobs) if progress else [], seed=self._seed(request, sample_index),
                     order=order, versions=[self.version] * len(progress.tokens) if progress else [])

    def _rescore(self, request: RolloutRequest, tokens: list[int]) -> list[float]:
        """Logprobs of `tokens` from one pass over prompt + tokens alone (`rollout.logprobs=rescored`):
        the same floats whichever batch or replica sampled them, which decode-time logprobs are not."""
        ids = torch.tensor(list(request.prompt_ids) + tokens, device=self.device)
        logits = self.decoder.score(ids)[len(request.prompt_ids) - 1 : -1]
        s = request.sampling
        scaled = logits / (1.0 if s.greedy else s.temperature)
        chosen = torch.tensor(tokens, device=self.device)[:, None]
        return torch.log_softmax(scaled, dim=-1).gather(-1, chosen)[:, 0].tolist()

    def _seed(self, request: RolloutRequest, sample_index: int) -> int:
        if request.sampling.seed is None:
            return self._rng.getrandbits(62)
        return (request.sampling.seed * 1_000_003 + sample_index) % (1 << 62)

    def _finish_reason(self, seq: LiveSample, token: int) -> str | None:
        if token in seq.stop_ids:
            return "stop"
        if seq.stop_strings:
            tail = self.tokenizer.decode(seq.tokens[-max(len(s) for s in seq.stop_strings):])
            if any(s in tail for s in seq.stop_strings):
                return "stop"
        if len(seq.tokens) >= seq.max_new or seq.prompt_len + len(seq.tokens) >= self.max_context:
            return "length"
        return None

    def _agree_abort(self) -> bool:
        flag = self._abort.is_set()
        if self.tp_group is None:
            return flag
        votes = torch.tensor([int(flag)], device=self.device)
        dist.all_reduce(votes, op=dist.ReduceOp.MAX, group=self.tp_group)
        return bool(votes[0])

    @property
    def tokenizer(self):
        if self._tokenizer is None:  # only stop strings need it
            from rlinf_like.models import load_tokenizer

            self._tokenizer = load_tokenizer(self.config.model_path)
        return self._tokenizer
