"""EngineClient: one request at a time from any thread, served by an engine's continuous `serve` loop.

A background thread runs `engine.serve(...)` for the client's whole life; `submit` hands a request over and
returns a `Future` that the serve loop completes when the request's samples are done, so callers that wait on
something else between requests (an agent's tools) never hold up the others: the engine keeps decoding whatever
has been submitted. `between_steps`, settable by the owner, runs before every decode step (where new weights go).
If the serve loop fails, every pending and later future fails with that error: nothing waits forever.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future

from rlinf_like.workers.rollout.base import RolloutEngine
from rlinf_like.workers.rollout.engine import engines_with
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult

IDLE_WAIT_S = 0.05  # how long the serve loop sleeps on an empty inbox before asking again (a submit wakes it)


class EngineClient:
    def __init__(self, engine: RolloutEngine):
        if not type(engine).serves_continuously:
            raise ValueError(f"EngineClient needs an engine that serves continuously (rollout.engine in "
                             f"{engines_with('serves_continuously')}); {type(engine).__name__} does not")
        self.engine = engine
        self.between_steps: Callable[[], None] | None = None  # the owner's hook, run before every decode step
        self._wake = threading.Condition()
        self._inbox: list[tuple[RolloutRequest, Future]] = []
        self._pending: dict[str, Future] = {}  # taken by the serve loop, by request id
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="engine-client", daemon=True)
        self._thread.start()

    @property
    def max_context(self) -> int:
        """Prompt + response tokens one request may hold in the engine."""
        return self.engine.max_context

    def submit(self, request: RolloutRequest) -> Future[RolloutResult]:
        """Thread-safe: the request's result, when all its samples are done. Request ids must be unique among
        the requests in flight."""
        return self.submit_many([request])[0]

    def submit_many(self, requests: list[RolloutRequest]) -> list[Future[RolloutResult]]:
        """`submit` for several requests at once: the engine takes them together (one admission round)."""
        futures: list[Future[RolloutResult]] = [Future() for _ in requests]
        with self._wake:
            if self._error is not None:
                for future in futures:
                    future.set_exception(self._error)
                return futures
            if self._closed:
                raise RuntimeError("EngineClient.submit after close()")
            in_flight = set(self._pending) | {r.request_id for r, _ in self._inbox}
            for request in requests:
                if request.request_id in in_flight:
                    raise ValueError(f"request {request.request_id!r} is already in flight; request ids must be "
                                     f"unique")
                in_flight.add(request.request_id)
            self._inbox.extend(zip(requests, futures))
            self._wake.notify()
        return futures

    def close(self, abort: bool = False) -> None:
        """End the serve loop once what was submitted is done (with `abort`, at once: unfinished samples come
        back partial, finish reason 'abort') and join its thread."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        while abort and self._thread.is_alive():  # again until it ends: a serve starting up clears an abort
            self.engine.abort()
            self._thread.join(0.1)
        self._thread.join()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close(abort=exc[0] is not None)

    # --- the serve thread ------------------------------------------------------------------------------------
    def _source(self, idle: bool) -> list[RolloutRequest] | None:
        with self._wake:
            if idle and not self._inbox and not self._closed:
                self._wake.wait(IDLE_WAIT_S)
            taken = [(r, f) for r, f in self._inbox if f.set_running_or_notify_cancel()]  # cancelled ones dropped
            self._inbox.clear()
            self._pending.update((r.request_id, f) for r, f in taken)
            if not taken and self._closed:
                return None
        return [request for request, _ in taken]

    def _on_result(self, result: RolloutResult) -> None:
        with self._wake:
            future = self._pending.pop(result.request_id)
        future.set_result(result)

    def _between_steps(self) -> None:
        if self.between_steps is not None:
            self.between_steps()

    def _serve(self) -> None:
        try:
            self.engine.serve(self._source, self._on_result, self._between_steps)
        except BaseException as error:  # noqa: BLE001 - every waiter must hear of it, whatever it is
            with self._wake:
                self._error = error
                failed = [f for _, f in self._inbox] + list(self._pending.values())
                self._inbox.clear()
                self._pending.clear()
            for future in failed:
                if not future.cancelled():
                    future.set_exception(error)
