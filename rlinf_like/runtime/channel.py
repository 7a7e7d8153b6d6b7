"""Channel[T]: a typed, bounded, multi-producer multi-consumer queue between workers.

    ch = Channel.create("rollout_results", item_type=RolloutResult, maxsize=64)
    ch.put(result, key="group-3", weight=n_tokens)   # TypeError if not a RolloutResult
    item = ch.get(timeout=30)                        # ChannelTimeout after 30 s
    batch = ch.get_batch(target_weight=4096)         # items until their weights reach 4096
    ch.close()                                       # consumers then see ChannelClosed

The queue state lives in one small Ray actor (the channel's store, channel_store.py), which clients reach over an
authenticated socket rather than through Ray actor calls: one Ray call costs more CPU than a whole item's trip
otherwise. Payloads never pass through the store as data. On a one-node cluster, an item whose tensors reach
64 KiB is written by the producer into a /dev/shm file that the consumer reads and unlinks (channel_wire.py); on
several nodes (or when /dev/shm is missing or full) it is `ray.put` once, tensors as out-of-band buffers
(serialization.py), and only the reference crosses the store, through Ray calls so that Ray keeps the object
alive. Such an object is owned by its producer (Ray 2.56 removed `ray.put(_owner=...)`): if the producer dies
before the item is read, the get raises an error naming the channel. Small tensor-free items travel inline as
bytes. Every put is acknowledged by the store before it returns, so per-producer order holds and a full channel
blocks the producer. The store never unpickles an item, so it does not need the item's class.

On the in-process backend (`cluster.backend=local`) the store is an object of this process, found by name, and
reached over the same socket; items still cross as copies (inline bytes or a /dev/shm file), as on Ray.
"""

from __future__ import annotations

import asyncio
import functools
import pickle
import secrets
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import ray
import ray.cloudpickle as cloudpickle

from rlinf_like.runtime import channel_wire as wire
from rlinf_like.runtime import local
from rlinf_like.runtime.channel_store import CLAIM, CLOSED, OK, REF_KINDS, TIMEOUT, ChannelStore, RemoteStore
from rlinf_like.runtime.errors import ChannelClosed, ChannelTimeout
from rlinf_like.runtime.serialization import UsesRaySerializer, pack, unpack

T = TypeVar("T")
DEFAULT_KEY = "default"
INLINE_MAX_TENSOR_BYTES = 64 * 1024  # below this, an item's payload is copied inline
_ASYNC_POOL = ThreadPoolExecutor(max_workers=64, thread_name_prefix="channel")  # as many as the store serves


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


@functools.cache
def _this_node() -> str:
    return ray.get_runtime_context().get_node_id()


class Channel(Generic[T]):
    """Client handle of a channel; cheap to pickle and pass to workers."""

    def __init__(self, name: str, item_type: type[T], store: ray.actor.ActorHandle, authkey: bytes,
                 address: tuple[str, int] | None = None, shm_node: str | None = None):
        self.name, self.item_type, self._store, self._authkey = name, item_type, store, authkey
        self._address, self._shm_node = address, shm_node  # shm_node: files in /dev/shm serve only this node

    # --- creation --------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str, item_type: type[T], maxsize: int = 0, namespace: str | None = None) -> Channel[T]:
        """A new channel; `maxsize` bounds the items held (0: unbounded), and a full channel blocks put."""
        if not isinstance(item_type, type):
            raise TypeError(f"channel {name!r}: item_type must be a class, got {item_type!r}")
        if maxsize < 0:
            raise ValueError(f"channel {name!r}: maxsize must be >= 0, got {maxsize}")
        authkey = secrets.token_bytes(32)  # travels only inside Ray calls and channel handles
        if local.owner() is not None:
            shm_node = "local" if wire.shm_available() else None
            store = ChannelStore(name, maxsize, cloudpickle.dumps(item_type), authkey, shm_node, host="127.0.0.1")
            local.register_channel(name, store)
            return cls(name, item_type, store, authkey, store.address(), shm_node)
        one_node = sum(1 for n in ray.nodes() if n["Alive"]) == 1
        shm_node = _this_node() if one_node and wire.shm_available() else None
        try:
            store = RemoteStore.options(name=_actor_name(name), namespace=namespace).remote(
                name, maxsize, cloudpickle.dumps(item_type), authkey, shm_node
            )
        except ValueError:  # Ray refuses a second actor with the same name
            raise ValueError(f"a channel named {name!r} already exists; use Channel.connect({name!r})") from None
        return cls(name, item_type, store, authkey, shm_node=shm_node)

    @classmethod
    def connect(cls, name: str, namespace: str | None = None) -> Channel:
        if local.owner() is not None:
            store = local.find_channel(name)
            blob, authkey, address, shm_node = store.handle_state()
            return cls(name, cloudpickle.loads(blob), store, authkey, tuple(address), shm_node)
        try:
            store = ray.get_actor(_actor_name(name), namespace=namespace)
        except ValueError:
            raise KeyError(f"no channel named {name!r}") from None
        blob, authkey, address, shm_node = ray.get(store.handle_state.remote())
        return cls(name, cloudpickle.loads(blob), store, authkey, tuple(address), shm_node)

    def ready(self) -> Channel[T]:
        """Wait until the store actor runs (its process starts in the background after `create`); a run
        calls this before its clock starts, so the first put or get does not pay the process start."""
        self._call("qsize", None)
        return self

    @property
    def _in_process(self) -> bool:
        return isinstance(self._store, ChannelStore)

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

    def _call(self, op: str, *args) -> Any:
        if self._address is None:
            self._address = tuple(self._result(self._store.address.remote()))
        try:
            return wire.request(self._address, self._authkey, op, *args)
        except wire.StoreUnreachable as err:
            raise self._store_gone(err) from None

    # --- put -------------------------------------------------------------------------------------
    def _encode(self, item: T) -> tuple:
        if not isinstance(item, self.item_type):
            raise TypeError(
                f"channel {self.name!r} carries {self.item_type.__qualname__}, "
                f"got {type(item).__module__}.{type(item).__qualname__}"
            )
        if payload_nbytes(item) < INLINE_MAX_TENSOR_BYTES:
            return _inline(item)
        try:
            packed = pack(item)
        except UsesRaySerializer:  # e.g. the item holds ObjectRefs: Ray must track them
            return ("ref", [ray.put(item)])
        if self._shm_node is not None and (self._in_process or self._shm_node == _this_node()):
            try:
                return wire.write_shm(packed)
            except OSError:  # /dev/shm full: the object store instead
                pass
        return _inline(item) if self._in_process else ("packed", [ray.put(packed)])

    def put(self, item: T, key: str = DEFAULT_KEY, weight: float = 1.0, timeout: float | None = None) -> None:
        """Blocks while the channel is full; ChannelTimeout after `timeout` s, ChannelClosed after close()."""
        entry = self._encode(item)
        try:
            if entry[0] in REF_KINDS:  # the store must borrow the refs through Ray
                status = self._result(self._store.put_refs.remote(key, entry, weight, timeout))
            else:
                status = self._call("put", key, entry, weight, timeout)
        except BaseException:
            if entry[0] == "shm":
                wire.unlink(entry[1])
            raise
        if status != OK and entry[0] == "shm":
            wire.unlink(entry[1])
        if status == CLOSED:
            raise ChannelClosed(f"put on closed channel {self.name!r}")
        if status == TIMEOUT:
            raise ChannelTimeout(f"channel {self.name!r} stayed full for {timeout:g}s (put, key {key!r})")

    async def put_async(self, item: T, key: str = DEFAULT_KEY, weight: float = 1.0, timeout: float | None = None):
        await asyncio.get_running_loop().run_in_executor(_ASYNC_POOL, self.put, item, key, weight, timeout)

    # --- get -------------------------------------------------------------------------------------
    def _decode_all(self, payloads: list[tuple]) -> list[T]:
        tokens = [p[1] for p in payloads if p[0] == CLAIM]
        claimed = iter(self._result(self._store.claim.remote(tokens)) if tokens else ())
        return [self._decode(next(claimed) if p[0] == CLAIM else p) for p in payloads]

    def _decode(self, payload: tuple) -> T:
        kind = payload[0]
        if kind == "inline":
            return pickle.loads(payload[1])
        if kind == "shm":
            try:
                return unpack(wire.read_shm(payload))
            except FileNotFoundError:
                raise RuntimeError(f"channel {self.name!r}: the item's shared-memory file {payload[1]} is not on "
                                   f"this node (the cluster grew after the channel was created)") from None
        try:
            value = ray.get(payload[1][0])
        except ray.exceptions.ObjectLostError as err:
            raise self._item_lost(err) from None
        return unpack(value) if kind == "packed" else value

    def _check_get(self, status: str, key: str, timeout: float | None) -> None:
        if status == CLOSED:
            raise ChannelClosed(f"channel {self.name!r} (key {key!r}) is closed and empty")
        if status == TIMEOUT:
            raise ChannelTimeout(f"channel {self.name!r} had no item under key {key!r} within {timeout:g}s")

    def get(self, key: str = DEFAULT_KEY, timeout: float | None = None) -> T:
        status, payload = self._call("get", key, timeout)
        self._check_get(status, key, timeout)
        return self._decode_all([payload])[0]

    async def get_async(self, key: str = DEFAULT_KEY, timeout: float | None = None) -> T:
        return await asyncio.get_running_loop().run_in_executor(_ASYNC_POOL, self.get, key, timeout)

    def get_batch(self, target_weight: float, key: str = DEFAULT_KEY, timeout: float | None = None) -> list[T]:
        """Items until their summed weights reach `target_weight` (fewer only once the channel is closed)."""
        if not target_weight > 0:
            raise ValueError(f"channel {self.name!r}: get_batch needs target_weight > 0, got {target_weight}")
        status, payloads = self._call("get_batch", key, target_weight, timeout)
        self._check_get(status, key, timeout)
        return self._decode_all(payloads)

    async def get_batch_async(self, target_weight: float, key: str = DEFAULT_KEY, timeout: float | None = None):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_ASYNC_POOL, self.get_batch, target_weight, key, timeout)

    def __iter__(self) -> Iterator[T]:
        """Yield items of the default key until the channel is closed and drained."""
        while True:
            try:
                yield self.get()
            except ChannelClosed:
                return

    # --- state -----------------------------------------------------------------------------------
    def qsize(self, key: str | None = None) -> int:
        return self._call("qsize", key)

    def close(self) -> None:
        self._call("close")

    @property
    def closed(self) -> bool:
        return self._call("is_closed")

    def destroy(self, timeout: float = 30.0) -> None:
        """Kill the store (and with it any items still queued); returns once it no longer answers."""
        if self._in_process:
            self._store.discard()
            self._store.shutdown()
            local.forget_channel(self.name)
            return
        try:
            ray.get(self._store.discard.remote(), timeout=timeout)  # unlink the queued items' /dev/shm files
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            pass
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
        if self._in_process:  # the store stays in this process: the copy finds it by name
            return (Channel.connect, (self.name,))
        return (Channel, (self.name, self.item_type, self._store, self._authkey, self._address, self._shm_node))

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, item_type={self.item_type.__qualname__})"


def _inline(item: Any) -> tuple:
    return ("inline", cloudpickle.dumps(item, protocol=pickle.HIGHEST_PROTOCOL))


def _actor_name(name: str) -> str:
    return f"channel:{name}"


def destroy_scoped(suffix: str) -> None:
    """Destroy every channel of the current Ray namespace whose name ends with `suffix` (a run on a borrowed cluster,
    at its end: its scoped names end with its run id), as `Channel.destroy` does: queued items' files, then the
    store; returns once each store is gone."""
    prefix = _actor_name("")
    for actor in ray.util.list_named_actors():
        if not (actor.startswith(prefix) and actor.endswith(suffix)):
            continue
        try:
            channel = Channel.connect(actor[len(prefix):])
        except (KeyError, ray.exceptions.RayActorError):  # already ending
            continue
        channel.destroy()
