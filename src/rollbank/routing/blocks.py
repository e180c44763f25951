"""Token-block hashing and a per-server approximate prefix index.

A prompt is cut into full blocks of ``block_size`` token ids (the trailing partial block is
ignored, as in a paged KV cache). Block ``i``'s hash chains block ``i-1``'s hash with the ids
of block ``i``, so equal hashes at position ``i`` mean equal prefixes of ``(i+1)*block_size``
tokens (up to hash collisions, which only cost a worse routing decision, never correctness).

:class:`BlockIndex` is what the cache-aware router believes one server's prefix cache holds,
learned from routing history (it never talks to the server). Invariants:
- entries are kept in least-recently-used order and touched on every route that sends them,
  a prompt's last block first, so that its first block is the most recently used: under
  capacity pressure a conversation loses its tail before its head, as vLLM frees a finished
  request's blocks in reverse ("so that the tail blocks are evicted first",
  vllm/v1/core/single_type_kv_cache_manager.py) and as the emulated engines' cache does
  (:mod:`rollbank.inference.prefix_cache`); head first, the index would believe a server lost a
  prefix it still holds;
- an entry older than ``max_age_s`` or beyond ``max_blocks`` (oldest first) is dropped, as a
  real KV cache would evict it;
- ``match`` counts the leading blocks present, so it is a prefix length, not a set overlap.

Python's ``hash`` of a tuple of ints does not depend on ``PYTHONHASHSEED``, so block hashes are
stable across processes and runs.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from itertools import repeat, takewhile

_ROOT = 0x5EED_B10C


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids``."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    return _extend([], list(token_ids), block_size)


def _extend(out: list[int], ids: list[int], block_size: int) -> list[int]:
    """``out`` (the chained hashes of ``ids``' first ``len(out)`` blocks) with the rest."""
    prev = out[-1] if out else _ROOT
    for start in range(len(out) * block_size, len(ids) - block_size + 1, block_size):
        prev = hash((prev, *ids[start : start + block_size]))
        out.append(prev)
    return out


class SessionHashes:
    """:func:`block_hashes` per session, extended rather than recomputed: an agent's next
    prompt is its last one plus the new turn, so only the new blocks are hashed.

    Exact: a session's cached hashes are reused only as far as the new prompt starts with
    the tokens they were computed from (compared, not assumed); an edited history is hashed
    again from its first changed block. Each session keeps a copy of its last prompt's ids:
    at most ``max_sessions`` sessions and ``max_tokens`` ids in all are kept (least recently
    used sessions dropped first; a dropped session's next prompt is hashed whole).
    """

    def __init__(self, block_size: int, *, max_sessions: int = 4096,
                 max_tokens: int = 1 << 23) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size = block_size
        self.max_sessions = max_sessions
        self.max_tokens = max_tokens
        self._last: OrderedDict[str, tuple[list[int], list[int]]] = OrderedDict()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._last)

    def hashes(self, session: str, token_ids: Sequence[int]) -> list[int]:
        ids, bs = list(token_ids), self.block_size
        last = self._last.pop(session, None)
        out: list[int] = []
        if last is not None:
            old_ids, old = last
            self._tokens -= len(old_ids)
            keep = min(len(old), len(ids) // bs)
            if ids[: keep * bs] != old_ids[: keep * bs]:  # edited: the first changed block
                keep = next(k for k in range(keep) if ids[k * bs:(k + 1) * bs]
                            != old_ids[k * bs:(k + 1) * bs])
            out = old[:keep]
        _extend(out, ids, bs)
        if len(ids) <= self.max_tokens:
            self._last[session] = (ids, out)
            self._tokens += len(ids)
        while self._last and (len(self._last) > self.max_sessions
                              or self._tokens > self.max_tokens):
            self._tokens -= len(self._last.popitem(last=False)[1][0])
        return list(out)

    @property
    def tokens(self) -> int:
        """Prompt ids held over all sessions."""
        return self._tokens


class BlockIndex:
    """LRU set of block hashes with last-use times (one per server)."""

    def __init__(self, *, max_blocks: int, max_age_s: float) -> None:
        self.max_blocks = max_blocks
        self.max_age_s = max_age_s
        self._blocks: OrderedDict[int, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, h: object) -> bool:
        return h in self._blocks

    def expire(self, now: float) -> int:
        """Drop entries unused for longer than ``max_age_s``; return how many."""
        dropped = 0
        limit = now - self.max_age_s
        while self._blocks:
            h, t = next(iter(self._blocks.items()))
            if t >= limit:
                break
            del self._blocks[h]
            dropped += 1
        return dropped

    def match(self, hashes: Sequence[int]) -> int:
        """How many leading blocks of ``hashes`` this index holds."""
        return len(list(takewhile(self._blocks.__contains__, hashes)))

    def touch(self, hashes: Sequence[int], now: float) -> None:
        """Record that the server now holds these blocks (most recently used), the last block
        first: the first block ends most recently used, so the tail is evicted first."""
        blocks = self._blocks
        tail_first = list(reversed(hashes))
        # re-inserted at the MRU end in that order (a pop and a set per block, in C: the same
        # order as setting and moving each to the end, at a fraction of the cost)
        deque(map(blocks.pop, tail_first, repeat(None)), maxlen=0)
        blocks.update(zip(tail_first, repeat(now)))
        while len(blocks) > self.max_blocks:
            blocks.popitem(last=False)

    def clear(self) -> None:
        self._blocks.clear()
