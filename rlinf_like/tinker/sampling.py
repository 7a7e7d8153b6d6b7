"""Tinker's `asample` on our native engine: the JSON request to a `RolloutRequest`, the result to a protobuf
SampleResponse. `compute_logprobs` is a sample of one token with `prompt_logprobs`: each prompt position's logprob
from one pass over the prompt (NaN at position 0, which nothing predicts)."""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import torch

from rlinf_like.tinker import wire
from rlinf_like.tinker.losses import UnsupportedLoss
from rlinf_like.workers.rollout import RolloutRequest, SamplingParams

DEFAULT_MAX_TOKENS = 256  # when the client sends none
_ids = itertools.count()
_UNSUPPORTED = ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k")


def prompt_tokens(prompt: dict) -> list[int]:
    tokens: list[int] = []
    for chunk in prompt.get("chunks", []):
        if chunk.get("type", "encoded_text") != "encoded_text":
            raise UnsupportedLoss(f"the prompt has a {chunk.get('type')} chunk; this server serves a text model: "
                                  f"encoded_text chunks only")
        tokens.extend(chunk["tokens"])
    return tokens


def request(body: dict) -> RolloutRequest:
    """The engine's request for an `asample` body; what it cannot serve is refused by name."""
    asked = [k for k in _UNSUPPORTED if body.get(k)]
    if asked or body.get("prompt_logprobs_last_n") is not None or body.get("target_prompt_logprobs") is not None:
        raise UnsupportedLoss(f"asample options not supported here: {asked or 'prompt_logprobs_last_n/target'}")
    params = body.get("sampling_params", {})
    stop = params.get("stop")
    stop_ids, stop_strings, ignore_eos = (), (), False
    if isinstance(stop, str):
        stop_strings = (stop,)
    elif isinstance(stop, list) and stop and all(isinstance(s, int) for s in stop):
        stop_ids = tuple(stop)
    elif isinstance(stop, list) and stop:
        stop_strings = tuple(stop)
    elif stop == []:  # no stop at all, the model's EOS included
        ignore_eos = True
    top_k = params.get("top_k", -1)
    sampling = SamplingParams(max_new_tokens=params.get("max_tokens") or DEFAULT_MAX_TOKENS,
                              temperature=params.get("temperature", 1.0), top_k=max(top_k, 0),
                              top_p=params.get("top_p", 1.0), stop_token_ids=stop_ids, stop_strings=stop_strings,
                              ignore_eos=ignore_eos, seed=params.get("seed"))
    return RolloutRequest(f"tinker-sample-{next(_ids)}", prompt_tokens(body["prompt"]), sampling,
                          n=int(body.get("num_samples", 1)))


def prompt_logprobs(engine, tokens: list[int]) -> list[float]:
    """log p(token i | tokens before it) for each prompt position, NaN at 0."""
    logits = engine.decoder.score(torch.tensor(tokens, device=engine.device))[:-1].float()
    chosen = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(tokens[1:], device=logits.device)[:, None])
    return [math.nan, *chosen[:, 0].tolist()]


def respond(engine, req: RolloutRequest, result, body: dict) -> bytes:
    """One request's SampleResponse from its engine result."""
    if result.error:
        raise UnsupportedLoss(result.error)
    sequences = [(ids, lps, "length" if reason == "length" else "stop")
                 for ids, lps, reason in zip(result.response_ids, result.logprobs, result.finish_reasons, strict=True)]
    return wire.encode_sample(sequences, prompt_logprobs(engine, req.prompt_ids) if body.get("prompt_logprobs")
                              else None)


_NEXT = object()  # `_loop`: nothing taken from the queue yet
# A client posts a step's requests one by one (the cookbook's math_rl: 32 of one sample each, a few ms apart): without
# a wait the first was decoded alone and the other 31 after it, two passes instead of one. The batcher gathers
# until no request has come for GATHER_GAP_S, at most GATHER_MAX_S after the first.
GATHER_GAP_S = 0.02
GATHER_MAX_S = 0.25


class Batcher:
    """Samples requests on one thread, each engine's waiting requests in one `generate` call: a client that sends a
    step's prompts at once (an RL loop) gets them decoded together, as the engine's continuous batching allows."""

    def __init__(self):
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tinker-sample")
        self._thread.start()

    def submit(self, engine, req: RolloutRequest, body: dict) -> Future:
        future: Future = Future()
        self._queue.put((engine, req, body, future))
        return future

    def call(self, fn: Callable[[], Any]) -> Future:
        """`fn()` on the sampling thread, after the requests submitted before it: what changes an engine (its
        weights) never runs while that engine decodes."""
        future: Future = Future()
        self._queue.put((None, fn, None, future))
        return future

    def close(self, timeout_s: float = 60.0) -> None:
        """Ends the thread after the requests queued so far, and waits for it: it holds engines, whose tensors must
        be freed before the interpreter exits (`TinkerService.close`)."""
        self._queue.put(None)
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        item = self._queue.get()
        while item is not None:  # None: closed
            if item[0] is None:  # a call
                _, fn, _, future = item
                try:
                    future.set_result(fn())
                except BaseException as error:  # noqa: BLE001 - the caller's future carries it
                    future.set_exception(error)
                item = self._queue.get()
                continue
            waiting, item = [item], _NEXT
            deadline = time.monotonic() + GATHER_MAX_S
            while (left := deadline - time.monotonic()) > 0:
                try:
                    queued = self._queue.get(timeout=min(GATHER_GAP_S, left))
                except queue.Empty:
                    break
                if queued is None or queued[0] is None:  # the end, or a call: after the requests gathered so far
                    item = queued
                    break
                waiting.append(queued)
            for engine in {id(w[0]): w[0] for w in waiting}.values():
                self._run(engine, [w for w in waiting if w[0] is engine])
            if item is _NEXT:
                item = self._queue.get()

    @staticmethod
    def _run(engine, items: list) -> None:
        try:
            results = engine.generate([req for _, req, _, _ in items])
        except BaseException as error:  # noqa: BLE001 - each waiting request fails with it
            for *_, future in items:
                future.set_exception(error)
            return
        for (_, req, body, future), result in zip(items, results, strict=True):
            try:
                future.set_result(respond(engine, req, result, body))
            except BaseException as error:  # noqa: BLE001
                future.set_exception(error)
