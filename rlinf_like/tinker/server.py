"""The HTTP side of the Tinker-compatible server: the routes the `tinker` 0.38 client calls under `/api/v1/`, on
FastAPI and uvicorn. Refusals at a call are 400s whose text the client raises; an operation that fails answers its
`retrieve_future` with 200 `{"error", "category"}` (a 5xx would make the client back off and retry for minutes).
Any API key that starts with `tml-` is accepted: the server is local."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
import uuid

import httpx
import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response

from rlinf_like.tinker import losses, wire
from rlinf_like.tinker.service import ProtocolError, TinkerService

HOLD_S = 20.0  # a retrieve_future waits this long for its result (the client's own timeout is 45 s)
PROTOBUF = "application/x-protobuf"
REFUSED = (ProtocolError, losses.UnsupportedLoss)


def build_app(service: TinkerService, settings: dict | None = None) -> FastAPI:
    """`settings`: what the client reads at start (`tinker.types.ClientConfigResponse`), e.g.
    `fwdbwd_max_chunk_len`, which splits a large forward_backward into chunks."""
    app = FastAPI()

    @app.exception_handler(ProtocolError)
    @app.exception_handler(losses.UnsupportedLoss)
    async def refused(_request: Request, error: Exception) -> JSONResponse:
        return JSONResponse({"detail": str(error)}, status_code=400)

    @app.middleware("http")
    async def api_key(request: Request, call_next):
        key = request.headers.get("x-api-key", "")
        if request.url.path.startswith("/api/v1/") and not key.startswith("tml-"):
            return JSONResponse({"detail": "X-API-Key must start with 'tml-' (any such key is accepted here)"},
                                status_code=401)
        return await call_next(request)

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"ok": True, "served": service.names}

    for router in (session_routes(service, settings), training_routes(service), sampling_routes(service)):
        app.include_router(router, prefix="/api/v1")
    return app


def session_routes(service: TinkerService, settings: dict | None) -> APIRouter:
    """The client's start-up and background calls: configuration, the session (its end frees its models),
    heartbeats, telemetry."""
    router = APIRouter()

    @router.post("/client/config")
    async def client_config() -> dict:
        return {"pjwt_auth_enabled": False, **(settings or {})}

    @router.post("/client/dynamic_config")
    async def dynamic_config() -> dict:
        return {}

    @router.post("/create_session")
    async def create_session() -> dict:
        return {"session_id": uuid.uuid4().hex[:12]}

    @router.post("/session_heartbeat")
    async def heartbeat() -> dict:
        return {}

    @router.post("/telemetry")
    async def telemetry() -> dict:
        return {"status": "accepted"}

    @router.post("/sessions/{session_id}/finish")
    async def finish(session_id: str) -> dict:
        service.finish_session(session_id)  # quick: the model's workers end on the service's create thread
        return {}

    return router


def training_routes(service: TinkerService) -> APIRouter:
    """A training client's calls; each answers a request id whose result `retrieve_future` gives."""
    router = APIRouter()

    @router.post("/create_model")
    async def create_model(request: Request) -> dict:
        body = await request.json()
        return {"request_id": service.create_model(body["session_id"], body["model_seq_id"], body["base_model"],
                                                   body.get("lora_config") or {})}

    @router.post("/get_info")
    async def get_info(request: Request) -> dict:
        return service.info((await request.json())["model_id"])

    @router.post("/forward_backward")
    async def forward_backward(request: Request) -> dict:
        if PROTOBUF not in request.headers.get("content-type", ""):
            raise ProtocolError("forward_backward bodies are protobuf (application/x-protobuf)")
        model_id, seq_id, data, loss_fn, config, forward_only = wire.decode_forward_backward(await request.body())
        losses.check_loss(loss_fn, config, data)  # refused at the call, by name
        return {"request_id": service.forward_backward(model_id, seq_id, data, loss_fn, config, forward_only)}

    @router.post("/optim_step")
    async def optim_step(request: Request) -> dict:
        body = await request.json()
        if body.get("optimizer_params") is not None:
            raise ProtocolError(f"optimizer_params {body['optimizer_params'].get('type')!r}: only adam_params here")
        return {"request_id": service.optim_step(body["model_id"], body["seq_id"], body.get("adam_params"))}

    @router.post("/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict:
        body = await request.json()
        session_id = body["model_id"].split(":train:")[0]
        return {"request_id": service.save_for_sampler(body["model_id"], body["seq_id"], body.get("path"),
                                                       body.get("sampling_session_seq_id"), session_id)}

    @router.post("/save_weights")
    async def save_weights(request: Request) -> dict:
        body = await request.json()
        return {"request_id": service.save_state(body["model_id"], body["seq_id"], body["path"])}

    @router.post("/load_weights")
    async def load_weights(request: Request) -> dict:
        body = await request.json()
        if "model_id" not in body:  # create_training_client_from_state*: a new model at the saved state
            return {"request_id": service.create_from_state(body["session_id"], body["model_seq_id"], body["path"],
                                                            bool(body.get("optimizer")))}
        return {"request_id": service.load_state(body["model_id"], body["seq_id"], body["path"],
                                                 bool(body.get("optimizer")))}

    return router


def sampling_routes(service: TinkerService) -> APIRouter:
    """Sampling sessions and samples, and `retrieve_future`, which every asynchronous call's result comes through."""
    router = APIRouter()

    @router.post("/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict:
        body = await request.json()
        sampler = await asyncio.to_thread(service.create_sampling_session, body["session_id"],
                                          body.get("sampling_session_seq_id"), body.get("model_path"),
                                          body.get("base_model"))
        return {"sampling_session_id": sampler}

    @router.get("/samplers/{sampler_id}")
    async def sampler(sampler_id: str) -> dict:
        return service.sampler_info(sampler_id)

    @router.post("/asample")
    async def asample(request: Request) -> dict:
        request_id, sequence_ids = service.sample(await request.json())
        return {"request_id": request_id, "sample_sequence_ids": sequence_ids}

    @router.post("/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        return await retrieve(service, (await request.json())["request_id"])

    return router


async def retrieve(service: TinkerService, request_id: str) -> Response:
    """A request's result once it is done (protobuf bytes or JSON), `try_again` after HOLD_S, or its error."""
    future = service.futures.get(request_id)
    if future is None:
        return JSONResponse({"detail": f"no request {request_id!r} here"}, status_code=404)
    try:
        result = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), HOLD_S)
    except TimeoutError:
        return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"})
    except REFUSED as error:
        return JSONResponse({"error": str(error), "category": "user"})
    except Exception as error:  # noqa: BLE001 - the client raises it as the operation's failure
        return JSONResponse({"error": f"{type(error).__name__}: {error}", "category": "server"})
    if isinstance(result, bytes):
        return Response(result, media_type=PROTOBUF)
    return JSONResponse(result)


class TinkerServer:
    """The app served by uvicorn on a background thread (`start`), or in the foreground (`run`)."""

    def __init__(self, service: TinkerService, host: str = "127.0.0.1", port: int = 0,
                 client_config: dict | None = None):
        self.service, self.host, self.port = service, host, port
        self.app = build_app(service, client_config)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def _bind(self) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))  # port 0: a free one, known before the server starts
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_config=None, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        return sock

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> None:
        sock = self._bind()
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True,
                                        name=f"tinker-server-{self.port}")
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._thread.is_alive():
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.05)
        raise RuntimeError(f"the Tinker server on {self.base_url} did not answer within {timeout_s} s")

    def run(self) -> None:
        sock = self._bind()
        self._server.run(sockets=[sock])

    def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(timeout=10)
        self.service.close()
