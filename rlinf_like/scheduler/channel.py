"""Channel[T]: a typed, bounded, multi-producer multi-consumer queue between workers.

    ch = Channel.create("rollout_results", item_type=RolloutResult, maxsize=64)
    ch.put(result, key="group-3", weight=n_tokens)   # TypeError if not a RolloutResult
    item = ch.get(timeout=30)                        # ChannelTimeout after 30 s
    batch = ch.get_batch(target_weight=4096)         # items until their weights reach 4096
    ch.close()                                       # consumers then see ChannelClosed

The queue state lives in one small Ray actor (the channel's store). Payloads never pass through
it as data: an item carrying tensors or arrays is `ray.put` once by the producer and only the
reference crosses the store (tensors packed as out-of-band buffers, scheduler/serialization.py, so
they enter the object store with one copy); the consumer
then reads it straight from the object store. The producer owns that object (Ray 2.56 removed
`ray.put(_owner=...)`): if the producer process dies before the item is read, the get raises an
error naming the channel. Small tensor-free items travel inline as bytes,
which is faster than a round trip through the object store. The store never unpickles an item,
so it does not need the item's class.

Timeouts and blocking happen inside the store, so a timed-out get never takes an item later.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import ray
import ray.cloudpickle as cloudpickle

from rlinf_like.scheduler.errors import ChannelClosed, ChannelTimeout
from rlinf_like.scheduler.serialization import UsesRaySerializer, pack, unpack

T = TypeVar("T")
DEFAULT_KEY = "default"
INLINE_MAX_TENSOR_BYTES = 64 * 1024  # below this, an item's payload is copied inline
_OK, _TIMEOUT, _CLOSED = "ok", "timeout", "closed"


def payload_nbytes(obj: Any, depth: int = 0) -> int:
    """Bytes held by tensors/arrays inside obj (dataclass fields, mappings, sequences), to a shallow depth."""
    if hasattr(obj, "untyped_storage") and hasattr(obj, "element_size"):  # torch.Tensor
        return obj.numel() * obj.element_size()
    if hasattr(obj, "nbytes") and hasattr(obj, "dtype"):  # numpy array
        return int(obj.nbytes)
    if isinstance(obj, ray.ObjectRef):
        return INLINE_MAX_TENSOR_BYTES  # refs must go through Ray's serializer to stay counted
    if depth >= 3 or isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return len(obj) if isinstance(obj, bytes) else 0
    if hasattr(obj, "__dataclass_fields__"):
        return sum(payload_nbytes(getattr(obj, f), depth + 1) for f in obj.__dataclass_fields__)
    if isinstance(obj, dict):
        return sum(payload_nbytes(v, depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(payload_nbytes(v, depth + 1) for v in obj)
    return 0


@dataclass
class _Entry:
    payload: Any  # ("inline", bytes) or ("ref", [ObjectRef])
    weight: float


class _ChannelStore:
    """Queue state of one channel. A threaded actor: blocked gets and puts wait on a condition."""

    def __init__(self, name: str, maxsize: int, item_type_blob: bytes):
        self.name, self.maxsize, self.item_type_blob = name, maxsize, item_type_blob
        self.queues: dict[str, deque[_Entry]] = {}
        self.size = 0
        self.closed = False
        self.cond = threading.Condition()

    def item_type(self) -> bytes:
        return self.item_type_blob

    @ray.method(concurrency_group="put")
    def put(self, key: str, payload: Any, weight: float, timeout: float | None) -> str:
        with self.cond:
            ok = self.cond.wait_for(lambda: self.closed or not self.maxsize or self.size < self.maxsize, timeout)
            if self.closed:
                return _CLOSED
            if not ok:
                return _TIMEOUT
            self.queues.setdefault(key, deque()).append(_Entry(payload, weight))
            self.size += 1
            self.cond.notify_all()
            return _OK

    def _pop(self, key: str) -> _Entry:
        entry = self.queues[key].popleft()
        self.size -= 1
        self.cond.notify_all()
        return entry

    @ray.method(concurrency_group="get")
    def get(self, key: str, timeout: float | None) -> tuple[str, Any]:
        with self.cond:
            self.cond.wait_for(lambda: self.closed or self.queues.get(key), timeout)
            if self.queues.get(key):
                return _OK, self._pop(key).payload
            return (_CLOSED if self.closed else _TIMEOUT), None

    @ray.method(concurrency_group="get")
    def get_batch(self, key: str, target_weight: float, timeout: float | None) -> tuple[str, list[Any]]:
        """Pop items until their weights reach target_weight. On timeout the popped items go back
        to the front of the queue (nothing is lost); after close() the remainder is returned."""
        deadline = None if timeout is None else time.monotonic() + timeout
        taken: list[_Entry] = []
        with self.cond:
            while sum(e.weight for e in taken) < target_weight:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                self.cond.wait_for(lambda: self.closed or self.queues.get(key), remaining)
                if self.queues.get(key):
                    taken.append(self._pop(key))
                elif self.closed:
                    break
                else:  # timed out
                    queue = self.queues.setdefault(key, deque())
                    queue.extendleft(reversed(taken))
                    self.size += len(taken)
                    self.cond.notify_all()
                    return _TIMEOUT, []
        if not taken:
            return _CLOSED, []
        return _OK, [e.payload for e in taken]

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def qsize(self, key: str | None) -> int:
        with self.cond:
            return self.size if key is None else len(self.queues.get(key, ()))

    def is_closed(self) -> bool:
        return self.closed


# Separate thread pools: gets blocked on an empty queue never starve puts, and the reverse;
# close/qsize run in the default group and are never blocked by either.
_RemoteStore = ray.remote(num_cpus=0, max_restarts=0, concurrency_groups={"put": 64, "get": 64})(_ChannelStore)


class Channel(Generic[T]):
    """Client handle of a channel; cheap to pickle and pass to workers."""

    def __init__(self, name: str, item_type: type[T], store: ray.actor.ActorHandle):
        self.name, self.item_type, self._store = name, item_type, store

    # --- creation --------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str, item_type: type[T], maxsize: int = 0, namespace: str | None = None) -> Channel[T]:
        """A new channel; `maxsize` bounds the items held (0: unbounded), and a full channel blocks put."""
        if not isinstance(item_type, type):
            raise TypeError(f"channel {name!r}: item_type must be a class, got {item_type!r}")
        if maxsize < 0:
            raise ValueError(f"channel {name!r}: maxsize must be >= 0, got {maxsize}")
        try:
            store = _RemoteStore.options(name=_actor_name(name), namespace=namespace).remote(
                name, maxsize, cloudpickle.dumps(item_type)
            )
        except ValueError:  # Ray refuses a second actor with the same name
            raise ValueError(f"a channel named {name!r} already exists; use Channel.connect({name!r})") from None
        return cls(name, item_type, store)

    @classmethod
    def connect(cls, name: str, namespace: str | None = None) -> Channel:
        try:
            store = ray.get_actor(_actor_name(name), namespace=namespace)
        except ValueError:
            raise KeyError(f"no channel named {name!r}") from None
        return cls(name, cloudpickle.loads(ray.get(store.item_type.remote())), store)

    def ready(self) -> Channel[T]:
        """Wait until the store actor runs (its process starts in the background after `create`); a run
        calls this before its clock starts, so the first put or get does not pay the process start."""
        self._result(self._store.item_type.remote())
        return self

    # --- store calls ---------------------------------------------------------------------------
    def _store_gone(self, err: Exception) -> ChannelClosed:
        return ChannelClosed(f"channel {self.name!r}: its store actor is gone ({type(err).__name__})")

    def _item_lost(self, err: Exception) -> RuntimeError:
        return RuntimeError(f"channel {self.name!r}: an item was lost with its producer: {err}")

    def _result(self, ref: ray.ObjectRef) -> Any:
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as err:
            raise self._store_gone(err) from err

    async def _result_async(self, ref: ray.ObjectRef) -> Any:
        try:
            return await ref
        except ray.exceptions.RayActorError as err:
            raise self._store_gone(err) from err

    # --- put -------------------------------------------------------------------------------------
    def _encode(self, item: T) -> tuple:
        if not isinstance(item, self.item_type):
            raise TypeError(
                f"channel {self.name!r} carries {self.item_type.__qualname__}, "
                f"got {type(item).__module__}.{type(item).__qualname__}"
            )
        if payload_nbytes(item) < INLINE_MAX_TENSOR_BYTES:
            return ("inline", cloudpickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))
        try:
            return ("packed", [ray.put(pack(item))])
        except UsesRaySerializer:  # e.g. the item holds ObjectRefs: Ray must track them
            return ("ref", [ray.put(item)])

    def _put_ref(self, item: T, key: str, weight: float, timeout: float | None) -> ray.ObjectRef:
        return self._store.put.remote(key, self._encode(item), weight, timeout)

    def put(self, item: T, key: str = DEFAULT_KEY, weight: float = 1.0, timeout: float | None = None) -> None:
        """Blocks while the channel is full; ChannelTimeout after `timeout` s, ChannelClosed after close()."""
        self._check_put(self._result(self._put_ref(item, key, weight, timeout)), key, timeout)

    async def put_async(self, item: T, key: str = DEFAULT_KEY, weight: float = 1.0, timeout: float | None = None):
        self._check_put(await self._result_async(self._put_ref(item, key, weight, timeout)), key, timeout)

    def _check_put(self, status: str, key: str, timeout: float | None) -> None:
        if status == _CLOSED:
            raise ChannelClosed(f"put on closed channel {self.name!r}")
        if status == _TIMEOUT:
            raise ChannelTimeout(f"channel {self.name!r} stayed full for {timeout:g}s (put, key {key!r})")

    # --- get -------------------------------------------------------------------------------------
    def _decode(self, payload: tuple) -> T:
        kind, data = payload
        if kind == "inline":
            return pickle.loads(data)
        try:
            value = ray.get(data[0])
        except ray.exceptions.ObjectLostError as err:
            raise self._item_lost(err) from None
        return unpack(value) if kind == "packed" else value

    async def _decode_async(self, payload: tuple) -> T:
        kind, data = payload
        if kind == "inline":
            return pickle.loads(data)
        try:
            value = await data[0]
        except ray.exceptions.ObjectLostError as err:
            raise self._item_lost(err) from None
        return unpack(value) if kind == "packed" else value

    def _check_get(self, status: str, key: str, timeout: float | None) -> None:
        if status == _CLOSED:
            raise ChannelClosed(f"channel {self.name!r} (key {key!r}) is closed and empty")
        if status == _TIMEOUT:
            raise ChannelTimeout(f"channel {self.name!r} had no item under key {key!r} within {timeout:g}s")

    def get(self, key: str = DEFAULT_KEY, timeout: float | None = None) -> T:
        status, payload = self._result(self._store.get.remote(key, timeout))
        self._check_get(status, key, timeout)
        return self._decode(payload)

    async def get_async(self, key: str = DEFAULT_KEY, timeout: float | None = None) -> T:
        status, payload = await self._result_async(self._store.get.remote(key, timeout))
        self._check_get(status, key, timeout)
        return await self._decode_async(payload)

    def _check_target(self, target_weight: float) -> None:
        if not target_weight > 0:
            raise ValueError(f"channel {self.name!r}: get_batch needs target_weight > 0, got {target_weight}")

    def get_batch(self, target_weight: float, key: str = DEFAULT_KEY, timeout: float | None = None) -> list[T]:
        """Items until their summed weights reach `target_weight` (fewer only once the channel is closed)."""
        self._check_target(target_weight)
        ref = self._store.get_batch.remote(key, target_weight, timeout)
        status, payloads = self._result(ref)
        self._check_get(status, key, timeout)
        return [self._decode(p) for p in payloads]

    async def get_batch_async(self, target_weight: float, key: str = DEFAULT_KEY, timeout: float | None = None):
        self._check_target(target_weight)
        ref = self._store.get_batch.remote(key, target_weight, timeout)
        status, payloads = await self._result_async(ref)
        self._check_get(status, key, timeout)
        return [await self._decode_async(p) for p in payloads]

    def __iter__(self) -> Iterator[T]:
        """Yield items of the default key until the channel is closed and drained."""
        while True:
            try:
                yield self.get()
            except ChannelClosed:
                return

    # --- state -----------------------------------------------------------------------------------
    def qsize(self, key: str | None = None) -> int:
        return self._result(self._store.qsize.remote(key))

    def close(self) -> None:
        self._result(self._store.close.remote())

    @property
    def closed(self) -> bool:
        return self._result(self._store.is_closed.remote())

    def destroy(self, timeout: float = 30.0) -> None:
        """Kill the store (and with it any items still queued); returns once it no longer answers."""
        ray.kill(self._store, no_restart=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # ray.kill is asynchronous
            try:
                ray.get(self._store.is_closed.remote())
            except ray.exceptions.RayActorError:
                return
            time.sleep(0.05)
        raise TimeoutError(f"channel {self.name!r}: the store was still answering {timeout:g}s after kill")

    def __reduce__(self):
        return (Channel, (self.name, self.item_type, self._store))

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, item_type={self.item_type.__qualname__})"


def _actor_name(name: str) -> str:
    return f"channel:{name}"

