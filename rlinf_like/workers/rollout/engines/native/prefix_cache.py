"""Automatic prefix caching for the native engine's paged KV cache (as vLLM's and SGLang's).

A `CachingBlockPool` is the engine's `BlockPool` that also remembers what its full blocks hold: a
sequence's full blocks (prompt and generated tokens alike) are *indexed* by their tokens and their
place in the chain: block i's key is (the block holding tokens [0, i * size), the block's own tokens),
a trie over blocks, so a key names the whole prefix exactly (no hashing, no collisions). When no
sequence holds an indexed block any more it is not freed but kept *idle*; a later request whose prompt
starts with the same tokens takes those blocks (counted references, shared, never written: a
sequence writes only past its prompt's cached part) and prefills only the rest. Idle blocks count as
available: `take` evicts the least recently used one when no block is free (with everything indexed
below it, whose keys name it), and releases free a chain's tail before its head, so tails go first.

The cache holds keys/values of one set of weights: the engine calls `clear` when the weights change;
a sequence whose keys/values began under older weights (`generation`) indexes nothing. With
`enabled=False` nothing is ever indexed: a plain pool.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from rlinf_like.workers.rollout.engines.native.paging import BlockPool

_ROOT = -1  # the parent of a chain's first block

Key = tuple[int, tuple[int, ...]]


class CachingBlockPool(BlockPool):
    def __init__(self, blocks: int, block_size: int, enabled: bool):
        super().__init__(blocks)
        self.block_size, self.enabled = block_size, enabled
        self.generation = 0  # bumped by clear(): keys/values computed before it are not indexed
        self._index: dict[Key, int] = {}  # (parent block, the block's tokens) -> block
        self._key: dict[int, Key] = {}  # indexed block -> its key
        self._children: dict[int, set[int]] = {}  # indexed block -> indexed blocks whose parent it is
        self._idle: OrderedDict[int, None] = OrderedDict()  # indexed blocks no sequence holds, oldest use first

    @property
    def available(self) -> int:
        return len(self._free) + len(self._idle)

    @property
    def cached(self) -> int:
        """Blocks in the index (held by sequences or idle)."""
        return len(self._key)

    def take(self) -> int:
        if not self._free:
            self._evict(next(iter(self._idle)))
        return super().take()

    def release(self, blocks: list[int]) -> None:
        for block in reversed(blocks):  # the tail first: the least recently used, evicted before its head
            self.refs[block] -= 1
            if self.refs[block] == 0:
                if block in self._key:
                    self._idle[block] = None
                else:
                    self._free.append(block)

    def lookup(self, tokens: Sequence[int], max_blocks: int) -> list[int]:
        """The indexed blocks holding tokens[: k * block_size] for the largest k <= max_blocks (no reference taken)."""
        if not self._index:
            return []
        bs, parent, found = self.block_size, _ROOT, []
        for i in range(min(len(tokens) // bs, max_blocks)):
            block = self._index.get((parent, tuple(tokens[i * bs:(i + 1) * bs])))
            if block is None:
                break
            found.append(block)
            parent = block
        return found

    def idle_among(self, blocks: list[int]) -> int:
        """How many of `blocks` are idle (taking them lowers `available` by as many)."""
        return sum(self.refs[block] == 0 for block in blocks)

    def acquire(self, blocks: list[int]) -> None:
        """Take a reference on each of `blocks` (found by `lookup`)."""
        for block in blocks:
            if self.refs[block] == 0:
                del self._idle[block]
            self.refs[block] += 1

    def insert(self, tokens: Sequence[int], blocks: Sequence[int], generation: int) -> None:
        """Index the chain `blocks` (a sequence's block table) as holding `tokens`: every block that `tokens`
        fills whole. Nothing when the keys/values began under an older `generation` or caching is off. A block
        whose prefix another block already holds stays out, and the chain goes on under that one."""
        if not self.enabled or generation != self.generation:
            return
        bs, parent = self.block_size, _ROOT
        for i, block in enumerate(blocks[:len(tokens) // bs]):
            key = (parent, tuple(tokens[i * bs:(i + 1) * bs]))
            known = self._index.get(key)
            if known is None and block not in self._key:
                self._index[key], self._key[block] = block, key
                self._children.setdefault(parent, set()).add(block)
                known = block
            elif known is None:  # indexed under another key: cannot be (a block's place fixes its tokens)
                raise AssertionError(f"prefix cache: block {block} is indexed under another prefix")
            parent = known

    def clear(self) -> None:
        """Forget every key (the weights changed): idle blocks are freed, held ones when released."""
        self._free.extend(self._idle)
        self._idle.clear()
        self._index.clear()
        self._key.clear()
        self._children.clear()
        self.generation += 1

    def _evict(self, block: int) -> None:
        """Drop `block` and everything indexed below it (their keys name it) from the index; idle ones are freed."""
        key = self._key[block]
        self._children[key[0]].discard(block)
        stack = [block]
        while stack:
            b = stack.pop()
            del self._index[self._key.pop(b)]
            stack.extend(self._children.pop(b, ()))
            if b in self._idle:
                del self._idle[b]
                self._free.append(b)
