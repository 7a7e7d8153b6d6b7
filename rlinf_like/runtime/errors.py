"""Errors raised at the caller when something goes wrong inside or around a worker."""

from __future__ import annotations


class WorkerError(RuntimeError):
    """A worker method raised. Carries the group, rank, method and the remote traceback."""

    def __init__(self, group: str, rank: int, method: str, remote_traceback: str, cause: BaseException | None):
        self.group, self.rank, self.method, self.cause = group, rank, method, cause
        self.remote_traceback = remote_traceback
        super().__init__(f"worker {group}[rank {rank}] raised in {method}():\n{remote_traceback}")

    def __reduce__(self):  # pickled with its fields (a process pool sends it back; the default passes only args)
        return type(self), (self.group, self.rank, self.method, self.remote_traceback, None)


class WorkerDiedError(RuntimeError):
    """A worker process is gone (killed, crashed, out of memory). `memory_kill`: it was killed for memory (the
    message then names its last measured memory and the keys that reduce it, not Ray's dump)."""

    def __init__(self, group: str, rank: int, method: str, detail: str, memory_kill: bool = False):
        self.group, self.rank, self.method, self.memory_kill = group, rank, method, memory_kill
        self.detail = detail
        super().__init__(f"worker {group}[rank {rank}] died during {method}(): {detail}")

    def __reduce__(self):
        return type(self), (self.group, self.rank, self.method, self.detail, self.memory_kill)


class GroupTimeoutError(TimeoutError):
    """Some ranks did not answer in time."""

    def __init__(self, group: str, method: str, pending_ranks: list[int], timeout: float):
        self.group, self.method, self.pending_ranks, self.timeout = group, method, pending_ranks, timeout
        super().__init__(
            f"worker group {group!r}: ranks {pending_ranks} did not finish {method}() within {timeout:g}s"
        )

    def __reduce__(self):
        return type(self), (self.group, self.method, self.pending_ranks, self.timeout)


class PlacementError(ValueError):
    """A component_placement entry is malformed, overlaps, is out of range or names an unknown component."""


class ChannelClosed(Exception):
    """The channel was closed and holds no more items (end of stream), or a put came after close()."""


class ChannelTimeout(TimeoutError):
    """A put or get did not complete within its timeout."""
