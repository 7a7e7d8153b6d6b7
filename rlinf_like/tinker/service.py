"""What a Tinker-compatible server holds: sessions, training models and sampling sessions, and the futures the
client polls. Training runs on our worker system (one `TinkerActor` group a model: in this process by default,
on Ray with `cluster.backend=ray`); sampling on our native engine.

Ordering: the client numbers each model's operations (`seq_id` from 1) and sends the chunks of one
`forward_backward` concurrently, first chunk last; a model runs them strictly in `seq_id` order, one at a time.
A retry re-posts the same `seq_id`: it gets the first post's future, so a gradient is never applied twice.
"""

from __future__ import annotations

import itertools
import json
import threading
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rlinf_like.models.export import complete_export
from rlinf_like.models import load_tokenizer
from rlinf_like.tinker.sampling import Batcher
from rlinf_like.tinker.sampling import request as sampling_request


STATE_FILE = "tinker.json"  # beside a saved state: its LoRA rank, for a client created from it
SAMPLER_KV_GB = 0.5  # each sampling session's KV cache (SmolLM2: ~2,600 tokens, one 2,048-token sequence)
ALPHA = 32.0  # LoRA alpha: the update is (32 / rank) * B @ A (the protocol sends no alpha)
# sampling sessions kept open, the newest: an RL loop opens one per step, and each holds its weights and KV cache
MAX_SAMPLERS = 4


class ProtocolError(ValueError):
    """A request this server refuses, with the reason the client shows."""


@dataclass
class Operation:
    seq_id: int
    run: Callable[[], Any]
    future: Future


@dataclass
class TrainedModel:
    """One LoRA training client's model: its actor group and its operations queued by `seq_id`."""

    model_id: str
    rank: int
    actor: Any  # WorkerGroup of TinkerActor
    next_seq: int = 1
    queued: dict[int, Operation] = field(default_factory=dict)
    posted: dict[int, str] = field(default_factory=dict)  # seq_id -> request id (retries get the same)
    lock: threading.Condition = field(default_factory=threading.Condition)
    finished: bool = False  # its session finished: the operations in order run, then its thread ends
    runner: threading.Thread | None = None
    adapters: Any = None  # its AdapterSpec, asked of the actor at its first in-memory sampler


class Futures:
    """Request ids and their futures, which `retrieve_future` long-polls."""

    def __init__(self):
        self._futures: dict[str, Future] = {}
        self._ids = itertools.count()

    def add(self, future: Future, kind: str) -> str:
        request_id = f"{kind}-{next(self._ids)}"
        self._futures[request_id] = future
        return request_id

    def get(self, request_id: str) -> Future | None:
        return self._futures.get(request_id)

    def of_kind(self, kind: str) -> list[Future]:
        """The futures of one kind of request ("fwdbwd", "optim", "sample", ...), in the order they came."""
        return [f for request_id, f in self._futures.items() if request_id.rsplit("-", 1)[0] == kind]


class TinkerService:
    def __init__(self, model_path: str, names: list[str], out: Path, cluster, precision: str = "fp32"):
        self.model_path, self.names, self.out, self.cluster = model_path, names, out, cluster
        self.precision = precision
        self.futures = Futures()
        self.models: dict[str, TrainedModel] = {}
        self.samplers: dict[str, Any] = {}  # sampling session id -> native engine
        self._base: dict | None = None  # the served model's adapted weights, which in-memory samplers merge onto
        self.sampler_paths: dict[str, str] = {}  # tinker:// path -> exported folder
        self._sampling = Batcher()
        self._create = ThreadPoolExecutor(1, thread_name_prefix="tinker-create")
        self._closed = False
        self.tokenizer = load_tokenizer(model_path)  # what an exported sampler checkpoint is completed with

    # --- sessions and models ----------------------------------------------------------------------------
    def check_base_model(self, base_model: str | None) -> None:
        if base_model is not None and base_model not in self.names:
            raise ProtocolError(f"base_model={base_model!r} is not served here; this server serves {self.names}")

    def create_model(self, session_id: str, model_seq_id: int, base_model: str, lora: dict) -> str:
        self.check_base_model(base_model)
        rank = int(lora.get("rank", 32))
        unknown = [k for k in ("train_unembed", "train_mlp", "train_attn") if lora.get(k) is False]
        if unknown:
            raise ProtocolError(f"lora_config {unknown} = false is not supported here: every linear layer is adapted")
        model_id = f"{session_id}:train:{model_seq_id}"
        self._check_no_model()
        return self.futures.add(self._create.submit(self._launch, model_id, rank), "create")

    def create_from_state(self, session_id: str, model_seq_id: int, path: str, optimizer: bool) -> str:
        """`create_training_client_from_state[_with_optimizer]`: a new model at a saved state, its LoRA rank the
        saved one's; the client names it `<session>:train:<model_seq_id>`."""
        folder = self.state_folder(path, optimizer)
        self._check_no_model()
        model_id, rank = f"{session_id}:train:{model_seq_id}", json.loads((folder / STATE_FILE).read_text())["rank"]

        def create() -> dict:
            self._launch(model_id, rank)
            self.models[model_id].actor.load(str(folder)).wait()
            return {"model_id": model_id, "path": path}

        return self.futures.add(self._create.submit(create), "load")

    def _check_no_model(self) -> None:
        if self.models:
            raise ProtocolError(f"this server trains one model at a time; {list(self.models)} exists")

    def _launch(self, model_id: str, rank: int) -> dict:
        from rlinf_like.hybrid_engines.fsdp.lora import LoraConfig
        from rlinf_like.hybrid_engines.fsdp.manager import FSDPConfig
        from rlinf_like.tinker.worker import TinkerActor
        from rlinf_like.workers.actor.config import ActorConfig

        if self._closed:
            raise ProtocolError("the server is shutting down")
        config = ActorConfig(model_path=self.model_path,
                             fsdp=FSDPConfig(precision=self.precision, lora=LoraConfig(rank=rank, alpha=ALPHA)))
        placement = self.cluster.place({"actor": "0"})
        actor = TinkerActor.create_group(config).launch(self.cluster, placement, "actor")
        model = self.models[model_id] = TrainedModel(model_id, rank, actor)
        model.runner = threading.Thread(target=self._run_in_order, args=(model,), daemon=True,
                                        name=f"tinker-{model_id}")
        model.runner.start()
        return {"model_id": model_id}

    def finish_session(self, session_id: str) -> None:
        """`sessions/{id}/finish` (the client's `with ServiceClient()` ends): the session's models and sampling
        sessions are dropped, so that the next client, a recipe run again, can create its model. The model's
        workers end on the creating thread, before any model created after this call is launched on the same
        devices."""
        for model in [m for m in self.models.values() if m.model_id.startswith(f"{session_id}:")]:
            self._finish_model(model)
        for sampler_id in [s for s in self.samplers if s.startswith(f"{session_id}:")]:
            del self.samplers[sampler_id]

    def _finish_model(self, model: TrainedModel, now: bool = False) -> None:
        del self.models[model.model_id]
        with model.lock:
            model.finished = True
            model.lock.notify_all()
        if now:
            self._end_model(model)
        else:
            self._create.submit(self._end_model, model)

    @staticmethod
    def _end_model(model: TrainedModel) -> None:
        model.runner.join()
        for op in model.queued.values():  # posted after a gap that never filled: they cannot run in order
            op.future.cancel()
        model.actor.shutdown()

    def model(self, model_id: str) -> TrainedModel:
        if model_id not in self.models:
            raise ProtocolError(f"model_id={model_id!r} is not a model of this server: {list(self.models)}")
        return self.models[model_id]

    def info(self, model_id: str) -> dict:
        model = self.model(model_id)
        return {"model_id": model_id, "is_lora": True, "lora_rank": model.rank, "model_name": self.names[-1],
                "model_data": {"model_name": self.names[-1], "arch": "causal_lm", "tokenizer_id": self.names[-1]}}

    # --- training operations, in seq_id order ------------------------------------------------------------
    def submit(self, model_id: str, seq_id: int, kind: str, run: Callable[[TrainedModel], Any]) -> str:
        model = self.model(model_id)
        with model.lock:
            if seq_id in model.posted:  # a retry of an operation already queued or done
                return model.posted[seq_id]
            if seq_id < model.next_seq:
                raise ProtocolError(f"seq_id={seq_id} for {model_id} is before the next expected ({model.next_seq}) "
                                    f"and was never posted")
            future: Future = Future()
            request_id = self.futures.add(future, kind)
            model.posted[seq_id] = request_id
            model.queued[seq_id] = Operation(seq_id, lambda: run(model), future)
            model.lock.notify_all()
        return request_id

    def _run_in_order(self, model: TrainedModel) -> None:
        while True:
            with model.lock:
                while model.next_seq not in model.queued and not model.finished:
                    model.lock.wait()
                if model.next_seq not in model.queued:
                    return
                op = model.queued.pop(model.next_seq)
                model.next_seq += 1
            if not op.future.set_running_or_notify_cancel():
                continue
            try:
                op.future.set_result(op.run())
            except BaseException as e:  # noqa: BLE001 - the client gets it as the operation's error
                op.future.set_exception(e)

    def forward_backward(self, model_id: str, seq_id: int, data, loss_fn: str, config: dict,
                         forward_only: bool) -> str:
        from rlinf_like.tinker import wire

        def run(model: TrainedModel) -> bytes:
            outputs, metrics = model.actor.tinker_forward_backward(data, loss_fn, config, forward_only).wait()[0]
            return wire.encode_forward_backward(outputs, metrics)

        return self.submit(model_id, seq_id, "forward" if forward_only else "fwdbwd", run)

    def optim_step(self, model_id: str, seq_id: int, adam: dict | None) -> str:
        if adam is None:
            raise ProtocolError("optim_step needs adam_params: other optimizers are not supported here")
        return self.submit(model_id, seq_id, "optim",
                           lambda model: {"metrics": model.actor.tinker_optim_step(adam).wait()[0]})

    def save_for_sampler(self, model_id: str, seq_id: int, name: str | None, sampling_seq: int | None,
                         session_id: str) -> str:
        """A named save exports the merged weights to a folder its `tinker://` path names. An unnamed one (the
        client's `save_weights_and_get_sampling_client`, an RL loop's every step) gets a sampler whose weights
        come from the actor in memory, the adapters merged onto the base weights: no path reaches the client, so
        nothing is written."""
        def run(model: TrainedModel) -> dict:
            if name is None:
                if model.adapters is None:
                    model.adapters = model.actor.adapter_spec().wait()[0]
                adapters = (model.adapters, model.actor.sampler_adapters().wait()[0])
                return {"sampling_session_id": self._open_sampler(session_id, sampling_seq, adapters=adapters)}
            folder = self.out / model_id.replace(":", "_") / "sampler_weights" / name
            model.actor.export_hf(str(folder)).wait()
            complete_export(folder, self.tokenizer, self.tokenizer.chat_template, base_model=self.model_path)
            path = f"tinker://{model_id}/sampler_weights/{name}"
            self.sampler_paths[path] = str(folder)
            return {"path": path}

        return self.submit(model_id, seq_id, "save-sampler", run)

    def save_state(self, model_id: str, seq_id: int, name: str) -> str:
        def run(model: TrainedModel) -> dict:
            folder = self.out / model_id.replace(":", "_") / "weights" / name
            model.actor.save(str(folder)).wait()
            (folder / STATE_FILE).write_text(json.dumps({"rank": model.rank, "base_model": self.model_path}))
            return {"path": f"tinker://{model_id}/weights/{name}"}

        return self.submit(model_id, seq_id, "save", run)

    def state_folder(self, path: str, optimizer: bool) -> Path:
        """The folder `save_state` wrote for a `tinker://<model>/weights/<name>` path."""
        if not path.startswith("tinker://") or "/weights/" not in path:
            raise ProtocolError(f"path={path!r} is not a tinker://<model>/weights/<name> path this server wrote")
        source_model, name = path.removeprefix("tinker://").split("/weights/", 1)
        folder = self.out / source_model.replace(":", "_") / "weights" / name
        if not (folder / STATE_FILE).is_file():
            raise ProtocolError(f"no saved state at {path}")
        if not optimizer:
            raise ProtocolError("loading weights without the optimizer state is not supported here: use the "
                                "*_with_optimizer call (weights and Adam's moments together)")
        return folder

    def load_state(self, model_id: str, seq_id: int, path: str, optimizer: bool) -> str:
        folder = self.state_folder(path, optimizer)

        def run(model: TrainedModel) -> dict:
            model.actor.load(str(folder)).wait()  # the adapters and Adam's moments, as `save_state` wrote them
            return {"path": path}

        return self.submit(model_id, seq_id, "load", run)

    # --- sampling ------------------------------------------------------------------------------------------
    def _open_sampler(self, session_id: str, sampling_seq: int | None, folder: str | None = None,
                      adapters: tuple | None = None) -> str:
        """A sampling session on the weights of `folder`, or on the served base merged with `adapters` (an
        `AdapterSpec` and the tensors). The oldest session goes once `MAX_SAMPLERS` are open; for adapters its
        engine, warm and with its KV cache allocated, merges them in place on the sampling thread, so an RL loop's
        sampler a step costs the adapters' few MB and a merge, not an export and a load."""
        sampler_id = f"{session_id}:sample:{sampling_seq if sampling_seq is not None else uuid.uuid4().hex[:6]}"
        spare = None
        while len(self.samplers) >= MAX_SAMPLERS:  # the oldest goes; asking it later is refused by name
            spare = self.samplers.pop(next(iter(self.samplers)))
        if adapters is None:
            engine = self._new_engine(folder or self.model_path)
        else:
            # every engine merges onto one copy of the base's adapted weights, taken from the first engine on the
            # served folder (its weights are the base); a reused engine's weights are overwritten where adapted
            engine = spare if spare is not None and self._base is not None else self._new_engine(self.model_path)

            def merge() -> None:
                engine.load_adapters(*adapters, base=self._base)
                self._base = engine.adapter_base()

            if engine is spare:  # it may still be decoding a request for its old session
                self._sampling.call(merge).result()
            else:
                merge()
        self.samplers[sampler_id] = engine
        return sampler_id

    def _new_engine(self, folder: str):
        from rlinf_like.workers.rollout import RolloutConfig, make_engine

        dtype = "float32" if self.precision == "fp32" else "auto"
        # a fixed KV cache: the default share of free memory (~2 GB here) would be allocated for every session
        return make_engine(RolloutConfig(engine="native", model_path=folder, dtype=dtype, max_batch_size=64,
                                         kv_cache_memory_gb=SAMPLER_KV_GB))

    def create_sampling_session(self, session_id: str, sampling_seq: int, model_path: str | None,
                                base_model: str | None) -> str:
        if model_path is not None:
            if model_path not in self.sampler_paths:
                raise ProtocolError(f"model_path={model_path!r} is not a sampler checkpoint of this server: "
                                    f"{sorted(self.sampler_paths)}")
            return self._open_sampler(session_id, sampling_seq, self.sampler_paths[model_path])
        self.check_base_model(base_model)
        return self._open_sampler(session_id, sampling_seq, self.model_path)

    def sample(self, body: dict) -> tuple[str, list[str]]:
        sampler_id = body.get("sampling_session_id")
        if sampler_id not in self.samplers:
            raise ProtocolError(f"sampling_session_id={sampler_id!r} is not open here (the {MAX_SAMPLERS} newest stay "
                                f"open): {sorted(self.samplers)}")
        request = sampling_request(body)  # checked now: a bad request is refused at the call
        engine = self.samplers[sampler_id]
        future = self._sampling.submit(engine, request, body)
        request_id = self.futures.add(future, "sample")
        return request_id, [f"{request_id}:{i}" for i in range(request.n)]

    def sampler_info(self, sampler_id: str) -> dict:
        if sampler_id not in self.samplers:
            raise ProtocolError(f"sampling session {sampler_id!r} is not open here")
        return {"sampler_id": sampler_id, "base_model": self.names[-1]}

    def close(self) -> None:
        """Ends every model's workers and the sampling thread before returning. A thread that drops the last
        reference to a tensor while the interpreter exits aborts the process (torch frees it without the GIL, and
        Python ends such a thread by unwinding through C++), so none is left running."""
        self._closed = True  # a create still queued refuses: no model outlives the server
        self._create.shutdown(wait=True)  # the queued ends and a launch already running finish first
        for model in list(self.models.values()):
            self._finish_model(model, now=True)
        self.samplers.clear()
        self._sampling.close()


def served_names(model_path: str) -> list[str]:
    """The names the served model answers to: its local path, and its hub id where the checkpoint records one
    (config.json's `_name_or_path`, or an offline package's `hub_id` file)."""
    names = [model_path, str(Path(model_path).resolve())]
    folder = Path(model_path)
    for source in (folder / "hub_id",):
        if source.is_file():
            names.append(source.read_text().strip())
    config = folder / "config.json"
    if config.is_file():
        hub = json.loads(config.read_text()).get("_name_or_path")
        if hub and "/" in hub and not Path(hub).exists():
            names.append(hub)
    return list(dict.fromkeys(names))

