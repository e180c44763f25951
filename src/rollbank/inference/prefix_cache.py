"""Block-hash prefix cache model (as vLLM's automatic prefix caching counts hits).

Owns :func:`block_hashes` and :class:`BlockPrefixCache`. Used by the fake server; a router
may use :func:`block_hashes` for prefix affinity.

Invariants
- A block is ``block_size`` consecutive tokens; only full blocks are hashed. A block's hash
  chains its parent's, so a block hits only when the whole prefix before it matches.
- The namespace (weights, adapter) seeds the chain: different weights never share blocks.
- A lookup never counts the last prompt token (vLLM recomputes it), hits are a whole number
  of blocks, and touched blocks become most recently used, a sequence's head after its tail,
  so that eviction (LRU by block) takes a sequence's tail before its prefix, as vLLM's does
  (it frees a request's blocks in reverse order).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence


def digest(*parts: object) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\x00")
    return h.digest()


def block_hashes(tokens: Sequence[int], block_size: int, namespace: object = None) -> list[bytes]:
    """Chained hashes of the full ``block_size`` blocks of ``tokens``."""
    parent = digest("root", namespace)
    keys: list[bytes] = []
    for i in range(len(tokens) // block_size):
        parent = digest(parent, tuple(tokens[i * block_size : (i + 1) * block_size]))
        keys.append(parent)
    return keys


class BlockPrefixCache:
    """LRU set of block hashes with vLLM-like hit accounting."""

    def __init__(self, block_size: int = 16, capacity_blocks: int = 4096) -> None:
        if block_size < 1 or capacity_blocks < 0:
            raise ValueError("block_size must be >= 1 and capacity_blocks >= 0")
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def _touch(self, keys: Sequence[bytes]) -> None:
        """Most recently used, the head last: a sequence's tail is evicted before its prefix
        (vLLM frees a request's blocks in reverse order for the same reason)."""
        for key in reversed(keys):
            self._blocks.move_to_end(key)

    def clear(self) -> None:
        self._blocks.clear()

    def lookup(self, prompt: Sequence[int], namespace: object = None) -> int:
        """Cached prompt tokens (whole blocks of the prompt minus its last token)."""
        hits: list[bytes] = []
        for key in block_hashes(prompt[: max(len(prompt) - 1, 0)], self.block_size, namespace):
            if key not in self._blocks:
                break
            hits.append(key)
        self._touch(hits)
        return len(hits) * self.block_size

    def insert(self, tokens: Sequence[int], namespace: object = None) -> None:
        keys = block_hashes(tokens, self.block_size, namespace)
        for key in keys:
            self._blocks[key] = None
        self._touch(keys)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
