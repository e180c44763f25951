"""Inference slots per server: the scheduler's second capacity (an owned component).

Owns :class:`InferenceSlots` (an :class:`~.capacities.InferenceCapacity`). At most
``inference_slots_per_server`` generate calls hold a slot on one server; waiters are granted
in priority order ``(seq, slot, retry)`` (older groups first), or first come first served
(``fifo``: ``naive`` mode). Pure bookkeeping: the driver turns grants into awakened futures.

The servers themselves are an input too (:meth:`InferenceSlots.set_servers`, from the
scheduler's ``on_servers``: managed servers that finish starting after collection began join
here); with servers declared and none serving, nothing launches.

Invariant: granted slots never exceed the limit on any server; a key waits at most once per
server.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from rollbank.scheduling.policy.types import AttemptKey


class InferenceSlots:
    """Per-server inference slot accounting."""

    def __init__(self, per_server: int, *, fifo: bool = False) -> None:
        self._slots = per_server
        self._fifo = fifo
        self._busy: dict[str, set[AttemptKey]] = {}
        self._wait: dict[str, list[tuple[tuple[int, ...], AttemptKey]]] = {}
        self._arrivals = 0
        self._servers: tuple[str, ...] | None = None  # None: not declared (whatever the router names)

    def set_servers(self, servers: Sequence[str]) -> bool:
        new = tuple(servers)
        if new == self._servers:
            return False
        self._servers = new
        return True

    @property
    def servers(self) -> tuple[str, ...] | None:
        return self._servers

    @property
    def available(self) -> bool:
        return self._servers is None or bool(self._servers)

    def request(self, key: AttemptKey, server: str) -> bool:
        busy = self._busy.setdefault(server, set())
        if len(busy) < self._slots:
            busy.add(key)
            return True
        self._arrivals += 1
        prio = (self._arrivals,) if self._fifo else (key.seq, key.slot, key.retry, self._arrivals)
        heapq.heappush(self._wait.setdefault(server, []), (prio, key))
        return False

    def release(self, key: AttemptKey, server: str) -> list[AttemptKey]:
        busy = self._busy.setdefault(server, set())
        busy.discard(key)
        wait = self._wait.get(server, [])
        granted = []
        while wait and len(busy) < self._slots:
            _, k = heapq.heappop(wait)
            busy.add(k)
            granted.append(k)
        return granted

    def cancel(self, key: AttemptKey, server: str) -> None:
        wait = self._wait.get(server, [])
        kept = [w for w in wait if w[1] != key]
        if len(kept) != len(wait):
            heapq.heapify(kept)
            self._wait[server] = kept

    def in_use(self, server: str) -> int:
        return len(self._busy.get(server, ()))

    def contended(self) -> bool:
        return any(self._wait.values())
