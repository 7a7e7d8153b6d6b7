"""An OpenAI-compatible HTTP endpoint over a rollout engine, so a black-box agent written against the
plain `openai` client can be trained.

`OpenAIServer` runs FastAPI under uvicorn in a background thread on 127.0.0.1. Each agent episode gets its
own session: `base_url(session_id)` is `http://127.0.0.1:PORT/sessions/<id>/v1`, so a stock
`openai.OpenAI(base_url=...)` client routes into it with no custom headers. The server records every sample
it returns as a `SessionCall` holding the engine's own prompt and response ids and logprobs; training reads
those (`session_trajectories`), never re-tokenized text. Requests go to the engine through `submit`, any
callable returning a `Future[RolloutResult]` (e.g. a client of the engine's continuous serve loop).

Routes: `/v1/models`, `/v1/chat/completions`, `/v1/completions`, each also under `/sessions/<id>`; calls to
the bare `/v1` routes are answered but recorded nowhere. Streaming sends the whole answer as events; tool calls
are parsed from the model's Hermes blocks when `tools` are given (openai_protocol.py). Not served: top-k
alternatives in logprobs, penalties.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from rlinf_like.workers.rollout.agentic.openai_protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    InvalidRequest,
    assistant_message,
    chat_logprobs,
    chat_messages,
    completion_logprobs,
    response_text,
    restore_produced,
    sampling_params,
    stream_events,
    usage,
)
from rlinf_like.workers.rollout.agentic.openai_sessions import SessionCall, SessionTrajectory, session_trajectories
from rlinf_like.workers.rollout.types import RolloutRequest, RolloutResult

Submit = Callable[[RolloutRequest], "Future[RolloutResult]"]

__all__ = ["OpenAIServer", "SessionCall", "SessionTrajectory", "Submit", "session_trajectories"]


class OpenAIServer:
    def __init__(self, submit: Submit, tokenizer, chat_template: str | None, model_name: str, max_context: int):
        self.submit, self.tokenizer, self.chat_template = submit, tokenizer, chat_template
        self.model_name, self.max_context = model_name, max_context
        self._sessions: dict[str, list[SessionCall]] = {}  # open sessions (base_url opens, pop_session closes)
        self._produced: dict[str, str] = {}  # first tool-call id of a message this server made -> its sampled text
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0
        self.app = self._build_app()

    # --- lifecycle ---------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> None:
        """Serve in a background thread on a free port; returns once the server answers."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))  # bound here, so the port is known and no other process can take it
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_config=None, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=1)
        # httpx logs every request at INFO, the readiness probe below included: a line per probe, per episode
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name=f"openai-server-{self.port}")
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}/v1/models", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"OpenAI server on 127.0.0.1:{self.port} did not answer within {timeout_s} s")
            time.sleep(0.05)

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)
            self._server = self._thread = None

    # --- sessions ----------------------------------------------------------------------------------------
    def base_url(self, session_id: str) -> str:
        """The base URL an `openai.OpenAI` client of this session uses; opens the session."""
        if not session_id or "/" in session_id:
            raise ValueError(f"session id {session_id!r}: must be non-empty, without '/'")
        with self._lock:
            self._sessions.setdefault(session_id, [])
        return f"http://127.0.0.1:{self.port}/sessions/{session_id}/v1"

    def calls(self, session_id: str) -> list[SessionCall]:
        """The samples served to the session so far, in the order they finished."""
        with self._lock:
            return list(self._sessions.get(session_id, []))

    def pop_session(self, session_id: str) -> list[SessionCall]:
        """Its calls; the session is closed (later requests to it get a 404)."""
        with self._lock:
            mine = f"call-{session_id}/"
            self._produced = {k: v for k, v in self._produced.items() if not k.startswith(mine)}
            return self._sessions.pop(session_id, [])

    def _record(self, session_id: str | None, calls: list[SessionCall]) -> None:
        if session_id is None:
            return
        with self._lock:
            if session_id in self._sessions:  # closed while the engine sampled: the episode is over
                self._sessions[session_id].extend(calls)

    def _check_open(self, session_id: str | None) -> None:
        with self._lock:
            if session_id is not None and session_id not in self._sessions:
                raise InvalidRequest(f"session {session_id!r} is not open (base_url() opens one, pop_session() "
                                     f"closes it)", param=None, status=404, kind="not_found_error")

    # --- serving -----------------------------------------------------------------------------------------
    async def _generate(self, session_id: str | None, prompt_ids: list[int], request, prompt_param: str):
        params = sampling_params(request, prompt_len=len(prompt_ids), max_context=self.max_context,
                                 prompt_param=prompt_param)
        request_id = f"{session_id or '-'}/{next(self._ids)}"
        result = await asyncio.wrap_future(self.submit(RolloutRequest(request_id, prompt_ids, params, request.n)))
        if not result.ok:
            raise InvalidRequest(f"the engine refused the request: {result.error}")
        version = result.oldest_version()
        self._record(session_id, [SessionCall(prompt_ids=list(prompt_ids), response_ids=list(ids), logprobs=list(lp),
                                              finish_reason=reason, version=version)
                                  for ids, lp, reason in zip(result.response_ids, result.logprobs,
                                                             result.finish_reasons)])
        return result, params

    def _chat_prompt(self, request: ChatCompletionRequest) -> list[int]:
        try:
            ids = self.tokenizer.apply_chat_template(
                chat_messages(restore_produced(request.messages, self._produced)), tools=request.tools, chat_template=self.chat_template,
                add_generation_prompt=True, tokenize=True, return_dict=False)
        except InvalidRequest:
            raise
        except Exception as e:  # the template's own checks (raise_exception) or a malformed message
            raise InvalidRequest(f"messages: the chat template cannot render them ({type(e).__name__}: {e})",
                                 param="messages") from e
        return list(ids)

    def _completion_prompt(self, request: CompletionRequest) -> list[int]:
        prompt = request.prompt
        if isinstance(prompt, str):
            return list(self.tokenizer(prompt).input_ids)
        if prompt and not all(isinstance(t, int) for t in prompt):
            raise InvalidRequest("prompt: one prompt per request (a string or a list of token ids)", param="prompt")
        bad = [t for t in prompt if not 0 <= t < len(self.tokenizer)]
        if bad or not prompt:
            raise InvalidRequest(f"prompt: token ids must be in 0..{len(self.tokenizer) - 1} and not empty; "
                                 f"got {bad[:5] or 'none'}", param="prompt")
        return list(prompt)

    async def _chat(self, session_id: str | None, request: ChatCompletionRequest) -> dict[str, Any]:
        self._check_open(session_id)
        result, params = await self._generate(session_id, self._chat_prompt(request), request, "messages")
        choices = []
        for i, (ids, lp, reason) in enumerate(zip(result.response_ids, result.logprobs, result.finish_reasons)):
            text = response_text(self.tokenizer, ids, params.stop_strings)
            message = assistant_message(text, request.tools, f"call-{result.request_id}-{i}")
            if "tool_calls" in message:
                with self._lock:
                    self._produced[message["tool_calls"][0]["id"]] = text
                reason = "tool_calls" if reason == "stop" else reason
            choices.append({"index": i, "message": message, "finish_reason": reason,
                            "logprobs": chat_logprobs(self.tokenizer, ids, lp) if request.logprobs else None})
        return {"id": f"chatcmpl-{result.request_id}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": usage(len(result.prompt_ids), result.response_ids)}

    async def _completion(self, session_id: str | None, request: CompletionRequest) -> dict[str, Any]:
        self._check_open(session_id)
        result, params = await self._generate(session_id, self._completion_prompt(request), request, "prompt")
        choices = []
        for i, (ids, lp, reason) in enumerate(zip(result.response_ids, result.logprobs, result.finish_reasons)):
            logprobs = completion_logprobs(self.tokenizer, ids, lp) if request.logprobs is not None else None
            choices.append({"index": i, "text": response_text(self.tokenizer, ids, params.stop_strings),
                            "finish_reason": reason, "logprobs": logprobs})
        return {"id": f"cmpl-{result.request_id}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "choices": choices,
                "usage": usage(len(result.prompt_ids), result.response_ids)}

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="rlinf_like rollout (OpenAI-compatible)")

        @app.exception_handler(InvalidRequest)
        async def invalid(_: Request, e: InvalidRequest) -> JSONResponse:
            return JSONResponse(e.body(), status_code=e.status)

        @app.exception_handler(RequestValidationError)
        async def unparsable(_: Request, e: RequestValidationError) -> JSONResponse:
            return JSONResponse(validation_error(e.errors()).body(), status_code=400)

        @app.exception_handler(HTTPException)
        async def http_error(_: Request, e: HTTPException) -> JSONResponse:
            kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
            return JSONResponse(InvalidRequest(str(e.detail), status=e.status_code, kind=kind).body(),
                                status_code=e.status_code)

        def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": 0,
                                                "owned_by": "rlinf_like"}]}

        for prefix in ("", "/sessions/{session_id}"):
            app.get(f"{prefix}/v1/models")(models)

            @app.post(f"{prefix}/v1/chat/completions")
            async def chat(request: ChatCompletionRequest, session_id: str | None = None) -> Any:
                return streamed(request, await self._chat(session_id, request))

            @app.post(f"{prefix}/v1/completions")
            async def completion(request: CompletionRequest, session_id: str | None = None) -> Any:
                return streamed(request, await self._completion(session_id, request))

        return app


def streamed(request, body: dict[str, Any]) -> dict[str, Any] | StreamingResponse:
    """`body` as JSON, or as server-sent events when the request asked to stream."""
    if not request.stream:
        return body
    include_usage = bool((request.stream_options or {}).get("include_usage"))
    return StreamingResponse(stream_events(body, include_usage), media_type="text/event-stream")


def validation_error(errors: list[dict[str, Any]]) -> InvalidRequest:
    """pydantic's first complaint about a request body as an OpenAI-style 400 naming the field."""
    error = errors[0]
    loc = [str(part) for part in error.get("loc", ()) if part != "body"]
    if error.get("type") == "json_invalid" or not loc:
        return InvalidRequest(f"the request body is not a valid JSON object ({error.get('msg')})")
    param = loc[0] + "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc[1:])
    if error.get("type") == "extra_forbidden":
        return InvalidRequest(f"Unrecognized request argument supplied: {param}", param=param)
    got = repr(error.get("input"))
    return InvalidRequest(f"{param}: {error.get('msg')} (got {got[:200]})", param=param)
