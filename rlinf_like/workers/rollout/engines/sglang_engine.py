"""Rollout through SGLang's offline engine (`sglang.Engine`), a GPU-only optional extra.

SGLang calls used (public offline-engine API, 2025-2026 releases):
  * `sglang.Engine(model_path, tp_size, base_gpu_id, dtype, mem_fraction_static, random_seed, enable_memory_saver,
    enable_weights_cpu_backup, [context_length])` (`sglang_tp.engine_kwargs`): memory saver + CPU weight backup
    make release/resume lossless. `tp_size` > 1: SGLang's own tensor parallelism over the replica's GPUs; the
    replica's first rank drives it, the others run `SGLangFollower` (see sglang_tp.py).
  * `engine.async_generate(input_ids=[...], sampling_params={...}, return_logprob=True, rid=...)`, one call
    per sample, driven on `engine.loop`; each result has `meta_info["output_token_logprobs"]`, a list of
    (logprob, token_id, text) for the sampled tokens, and `meta_info["finish_reason"]["type"]` in
    {"stop", "length", "abort"}. Sampling keys: max_new_tokens, temperature (0 = greedy), top_k (-1 = off),
    top_p, stop_token_ids, stop, ignore_eos, sampling_seed.
  * `engine.tokenizer_manager.abort_request(rid)`: stops a request; it returns partial with reason "abort".
  * `release_memory_occupation()` / `resume_memory_occupation()`, `update_weights_from_tensor(named_tensors=
    [(name, tensor)], flush_cache=...)`, `flush_cache()`, `shutdown()`.
Logprobs: by default SGLang returns log softmax(logits / temperature) before top-k/top-p (greedy runs at
temperature 1), what `RolloutResult` promises; do not set SGLANG_RETURN_ORIGINAL_LOGPROB.
Seeds: `sampling_seed` is only honoured when the engine runs with `enable_deterministic_inference=True`
(pass it as an engine kwarg); otherwise sampling uses SGLang's global RNG (`random_seed`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import torch

from rlinf_like.hybrid_engines.reshard import TensorLayout
from rlinf_like.utils.extras import require
from rlinf_like.workers.rollout.base import ResultCallback, RolloutConfig
from rlinf_like.workers.rollout.engines.staged_engine import StagedWeightsEngine, checkpoint_shapes
from rlinf_like.workers.rollout.engines.sglang_tp import (SGLangFollower, engine_kwargs, replica_devices, sglang_layouts,
                                                  visible_devices)
from rlinf_like.workers.rollout.types import (RolloutRequest, RolloutResult, SampleProgress, collected, rejected,
                                              request_error)

ABORT_GRACE_S = 30.0  # after an abort, how long to wait for SGLang to hand back the partial samples
BUCKET_BYTES = 512 << 20  # weights are pushed in buckets so one sync never serialises the whole model at once
Sample = tuple[list[int], list[float], str]


class SGLangEngine(StagedWeightsEngine):
    supports_tp = True  # sglang.Engine(tp_size=rollout.tp_size) over the replica's GPUs (sglang_tp.py)
    continues_migrated = True
    needs_gpu = True
    extra_module = "sglang"

    @classmethod
    def create(cls, config: RolloutConfig, process_group=None, tokenizer=None,
               device: str = "cpu") -> SGLangEngine | SGLangFollower:
        """SGLang loads its own tokenizer and places itself on the GPUs. With a process group of tp ranks (one
        replica), its first rank starts one TP engine over all their GPUs and the others follow."""
        if process_group is None:
            return cls(config)
        import torch.distributed as dist

        tp, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
        if tp == 1:
            return cls(config, tp_size=1)
        devices = replica_devices(process_group)  # a collective: every rank, before any returns
        if rank:
            return SGLangFollower(checkpoint_shapes(config.model_path), getattr(torch, config.dtype), tp, rank)
        return cls(config, tp_size=tp, devices=devices)

    def __init__(self, config: RolloutConfig, tp_size: int | None = None, devices: str | None = None,
                 **extra_kwargs):
        """`tp_size`: GPUs the engine spans (None: rollout.tp_size); `devices`: their CUDA_VISIBLE_DEVICES for
        SGLang's processes (None: this process's); `extra_kwargs` go to sglang.Engine (e.g. attention_backend,
        enable_deterministic_inference)."""
        sgl = require("sglang")  # first: a clear MissingExtraError before any work
        super().__init__(config)
        self._offloaded = False
        self._pending_push = False
        kwargs = engine_kwargs(config, tp_size, **extra_kwargs)
        self.tp_size = kwargs["tp_size"]
        with visible_devices(devices):  # SGLang's TP processes inherit it at spawn
            self.engine = sgl.Engine(**kwargs)

    # --- generation ------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[RolloutRequest], on_result: ResultCallback | None = None) -> list[RolloutResult]:
        self._abort.clear()  # an abort that came after the last generate ended must not stop this one
        results: list[RolloutResult | None] = [None] * len(requests)
        jobs = []
        for i, request in enumerate(requests):
            error = request_error(request, self.max_context, 1 << 30)  # SGLang schedules any n: no slot limit
            if error is not None:
                results[i] = rejected(request, error, self.version)
                if on_result is not None:
                    on_result(results[i])
            else:
                jobs.append(i)
        if jobs:
            self.engine.loop.run_until_complete(self._serve(requests, jobs, results, on_result))
        return results

    def _sampling_params(self, request: RolloutRequest, sample_index: int) -> dict:
        s = request.sampling
        seed = self._sample_seed(request, sample_index)
        return {
            "max_new_tokens": min(s.max_new_tokens, self.max_context - len(request.prompt_ids)),
            "temperature": s.temperature, "top_k": s.top_k if s.top_k > 0 else -1,
            "top_p": 1.0 if s.greedy else s.top_p, "ignore_eos": s.ignore_eos,
            "stop_token_ids": list(s.stop_token_ids) or None, "stop": list(s.stop_strings) or None,
            "sampling_seed": seed,  # always distinct: deterministic mode gives unseeded samples one fixed seed
        }

    async def _serve(self, requests, jobs: list[int], results: list, on_result: ResultCallback | None) -> None:
        loop = asyncio.get_running_loop()
        owner, samples, rids = {}, {i: [None] * requests[i].n for i in jobs}, []
        for i in jobs:
            for j, progress in enumerate(requests[i].progress):
                if progress.done:
                    samples[i][j] = list(progress.tokens), list(progress.logprobs), progress.finish_reason
            if not requests[i].unfinished():  # every sample finished before the move: nothing to run
                results[i] = self._result(requests[i], samples[i])
                if on_result is not None:
                    on_result(results[i])
            for j in requests[i].unfinished():
                rid = f"{requests[i].request_id}/{j}/{uuid.uuid4().hex}"  # unique across calls
                params = self._sampling_params(requests[i], j)
                so_far = requests[i].progress[j] if requests[i].progress else SampleProgress()
                # a migrated sample goes on from its tokens (SGLang's noise differs from the first replica's:
                # a valid continuation, not the very tokens the first replica would have drawn)
                params["max_new_tokens"] -= len(so_far.tokens)
                task = asyncio.ensure_future(self._sample([*requests[i].prompt_ids, *so_far.tokens], params, rid,
                                                          so_far))
                owner[task] = (i, j)
                rids.append(rid)
        pending, deadline = set(owner), None
        while pending:
            done, pending = await asyncio.wait(pending, timeout=0.02, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                i, j = owner[task]
                samples[i][j] = task.result()
                if all(s is not None for s in samples[i]):
                    results[i] = self._result(requests[i], samples[i])
                    if on_result is not None:
                        on_result(results[i])
            if self._abort.is_set() and deadline is None:
                for rid in rids:  # unknown or finished rids are ignored by SGLang
                    self.engine.tokenizer_manager.abort_request(rid)
                deadline = loop.time() + ABORT_GRACE_S
            if deadline is not None and loop.time() > deadline:
                for task in pending:  # SGLang never answered: give up on them as aborted
                    task.cancel()

    async def _sample(self, prompt: list[int], params: dict, rid: str, so_far: SampleProgress) -> Sample | str:
        try:
            out = await self.engine.async_generate(input_ids=list(prompt), sampling_params=params,
                                                   return_logprob=True, rid=rid)
        except asyncio.CancelledError:
            return list(so_far.tokens), list(so_far.logprobs), "abort"
        except Exception as err:  # noqa: BLE001 - after an abort SGLang may raise instead of returning partial
            if self._abort.is_set():
                return list(so_far.tokens), list(so_far.logprobs), "abort"
            return f"sglang: {type(err).__name__}: {err}"
        meta = out["meta_info"]
        pairs = meta.get("output_token_logprobs") or []  # (logprob, token id, text): the sampled tokens
        reason = meta.get("finish_reason")
        kind = reason.get("type") if isinstance(reason, dict) else str(reason or "")
        reason = kind if kind in ("stop", "length") else "abort"
        return ([*so_far.tokens, *(int(t) for _, t, *_ in pairs)],
                [*so_far.logprobs, *(float(p) for p, *_ in pairs)], reason)

    def _result(self, request: RolloutRequest, samples: list[Sample | str]) -> RolloutResult:
        errors = [s for s in samples if isinstance(s, str)]
        if errors:  # SGLang refused a sample: the whole group is reported, the other requests go on
            return rejected(request, f"request {request.request_id!r}: {errors[0]}", self.version)
        return collected(request, samples, self.version)

    # --- memory ----------------------------------------------------------------------------------------
    def offload(self) -> None:
        if not self._offloaded:
            self.engine.release_memory_occupation()  # weights (backed up on host) and KV cache
            self._offloaded = True

    def onload(self) -> None:
        if self._offloaded:
            self.engine.resume_memory_occupation()
            self._offloaded = False
            self.engine.flush_cache()  # cached prefixes point into KV memory that was given back
        if self._pending_push:  # a sync arrived while offloaded: its weights go in now
            self._push_weights()

    # --- weights ---------------------------------------------------------------------------------------
    def weight_layouts(self) -> list[TensorLayout]:
        # the driver (this process, TP rank 0) receives whole tensors; SGLang shards them itself when loading
        return sglang_layouts(self._shapes, self.dtype, self.tp_size)

    def _weights_changed(self) -> None:
        self._pending_push = True
        if not self._offloaded:  # released weights cannot be written; onload pushes them
            self._push_weights()

    def _push_weights(self) -> None:
        items = list(self.weight_tensors().items())
        bucket, size = [], 0
        for k, (name, tensor) in enumerate(items):
            bucket.append((name, tensor))
            size += tensor.numel() * tensor.element_size()
            last = k == len(items) - 1
            if size >= BUCKET_BYTES or last:
                out = self.engine.update_weights_from_tensor(named_tensors=bucket, flush_cache=last)
                if isinstance(out, tuple) and not out[0]:
                    raise RuntimeError(f"sglang update_weights_from_tensor failed: {out[1]}")
                bucket, size = [], 0
        self._pending_push = False

    def shutdown(self) -> None:
        self.engine.shutdown()
