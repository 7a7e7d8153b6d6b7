"""The store of one channel: its queue state, served over a socket and, for items holding ObjectRefs, as Ray calls.

A Ray actor call costs ~1-5 ms of CPU on a loaded 2-core machine (task submission, arg serialization, reference
bookkeeping); a request over a plain TCP connection costs ~0.06 ms. So clients talk to the store over an
authenticated `multiprocessing.connection` (one connection per client thread, one server thread per connection),
and only entries that hold ObjectRefs go through Ray: Ray must see those refs cross processes to keep the objects
alive (the store borrows them on `put_refs`, the consumer on `claim`).

Entries are tuples the store never unpickles (it does not need the item's class):
    ("inline", pickled bytes)                   small items
    ("shm", path, pickle stream, buffer sizes)  tensors in a /dev/shm file the consumer reads and unlinks
    ("packed" | "ref", [ObjectRef])             tensors in Ray's object store (multi-node, or items holding refs)
Timeouts and blocking happen here, so a timed-out get never takes an item later.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Listener, answer_challenge, deliver_challenge
from typing import Any

import ray

from rlinf_like.runtime.channel_wire import SHM_PREFIX, unlink

OK, TIMEOUT, CLOSED, CLAIM = "ok", "timeout", "closed", "claim"
REF_KINDS = ("packed", "ref")


@dataclass
class _Entry:
    payload: tuple
    weight: float


class ChannelStore:
    """Queue state of one channel. Blocked gets and puts wait on one condition."""

    def __init__(self, name: str, maxsize: int, item_type_blob: bytes, authkey: bytes, shm_node: str | None,
                 host: str | None = None):
        self.name, self.maxsize, self.item_type_blob, self.shm_node = name, maxsize, item_type_blob, shm_node
        self.queues: dict[str, deque[_Entry]] = {}
        self.size = 0
        self.closed = False
        self.cond = threading.Condition()
        self.claims: dict[int, tuple] = {}  # ref entries popped over the socket, until the consumer's claim call
        self._tokens = itertools.count()
        self._authkey = authkey
        host = host or ray.util.get_node_ip_address()  # in process (cluster.backend=local): 127.0.0.1
        self._listener = Listener((host, 0), family="AF_INET", backlog=128)
        threading.Thread(target=self._accept, name=f"channel-{name}-accept", daemon=True).start()

    # --- Ray methods -------------------------------------------------------------------------------
    def item_type(self) -> bytes:
        return self.item_type_blob

    def handle_state(self) -> tuple:
        """What `Channel.connect` needs to build a handle (over Ray: the key never crosses the socket)."""
        return self.item_type_blob, self._authkey, self._listener.address, self.shm_node

    def address(self) -> tuple[str, int]:
        return self._listener.address

    @ray.method(concurrency_group="put")
    def put_refs(self, key: str, payload: tuple, weight: float, timeout: float | None) -> str:
        return self.put(key, payload, weight, timeout)

    def claim(self, tokens: list[int]) -> list[tuple]:
        with self.cond:
            return [self.claims.pop(t) for t in tokens]

    def discard(self) -> int:
        """Unlink the shared-memory files of the items still queued (before the store is killed)."""
        with self.cond:
            entries = [e.payload for q in self.queues.values() for e in q]
            self.queues.clear()
            self.size = 0
        paths = [p[1] for p in entries if p[0] == "shm" and os.path.basename(p[1]).startswith(SHM_PREFIX)]
        for path in paths:
            unlink(path)
        return len(paths)

    # --- queue operations (socket and Ray) ---------------------------------------------------------
    def put(self, key: str, payload: tuple, weight: float, timeout: float | None) -> str:
        with self.cond:
            ok = self.cond.wait_for(lambda: self.closed or not self.maxsize or self.size < self.maxsize, timeout)
            if self.closed:
                return CLOSED
            if not ok:
                return TIMEOUT
            self.queues.setdefault(key, deque()).append(_Entry(payload, weight))
            self.size += 1
            self.cond.notify_all()
            return OK

    def _leave(self, payload: tuple) -> tuple:
        if payload[0] in REF_KINDS:  # its refs can only leave through Ray: the consumer claims it next
            token = next(self._tokens)
            self.claims[token] = payload
            return (CLAIM, token)
        return payload

    def get(self, key: str, timeout: float | None) -> tuple[str, Any]:
        with self.cond:
            self.cond.wait_for(lambda: self.closed or self.queues.get(key), timeout)
            if self.queues.get(key):
                self.size -= 1
                self.cond.notify_all()
                return OK, self._leave(self.queues[key].popleft().payload)
            return (CLOSED if self.closed else TIMEOUT), None

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
                    taken.append(self.queues[key].popleft())
                    self.size -= 1
                    self.cond.notify_all()  # a full channel has room again: producers go on while this waits
                elif self.closed:
                    break
                else:  # timed out
                    self.queues.setdefault(key, deque()).extendleft(reversed(taken))
                    self.size += len(taken)
                    self.cond.notify_all()  # another consumer of this key may take them
                    return TIMEOUT, []
            return (OK, [self._leave(e.payload) for e in taken]) if taken else (CLOSED, [])

    def close(self) -> None:
        with self.cond:
            self.closed = True
            self.cond.notify_all()

    def qsize(self, key: str | None) -> int:
        with self.cond:
            return self.size if key is None else len(self.queues.get(key, ()))

    def is_closed(self) -> bool:
        return self.closed

    # --- socket server -----------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Close the queue and stop listening (an in-process store; a Ray store dies with its actor)."""
        self.close()
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except OSError:  # the listener was closed
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn) -> None:
        ops = {"put": self.put, "get": self.get, "get_batch": self.get_batch, "close": self.close,
               "qsize": self.qsize, "is_closed": self.is_closed}
        try:
            deliver_challenge(conn, self._authkey)  # here, not in the accept loop: a silent client blocks only itself
            answer_challenge(conn, self._authkey)
            while True:
                op, args = conn.recv()
                conn.send(ops[op](*args))
        except (EOFError, OSError, AuthenticationError):  # the client went away, or never knew the key
            pass
        finally:
            conn.close()


# Ray calls are few (start-up, ref entries, claims); the socket serves the rest on its own threads.
RemoteStore = ray.remote(num_cpus=0, max_restarts=0, concurrency_groups={"put": 64})(ChannelStore)
