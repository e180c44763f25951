"""Inference slots per server: the scheduler's second capacity (a mixin of the Scheduler).

At most ``inference_slots_per_server`` generate calls hold a slot on one server; waiters are
granted in priority order ``(seq, slot, retry)`` (older groups first), or first come first
served in ``naive`` mode. Pure bookkeeping: the driver turns grants into awakened futures.

The servers themselves are an input too: :meth:`InferenceSlots.on_servers` (managed servers
that finish starting after collection began join here, ``servers`` event); with servers
declared and none serving, nothing launches.

Invariant: granted slots never exceed the limit on any server; a key waits at most once per
server.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from rollbank.clock import Clock
from rollbank.scheduling.events import Event, EventKind, ServersChanged
from rollbank.scheduling.types import AttemptKey


class InferenceSlots:
    """Per-server inference slot accounting, mixed into the scheduler."""

    _inf_slots: int
    _inf_busy: dict[str, set[AttemptKey]]
    _inf_wait: dict[str, list[tuple[tuple[int, ...], AttemptKey]]]
    _arrivals: int
    _inf_servers: tuple[str, ...] | None  # None: not declared (whatever the router names)
    clock: Clock
    outbox: list[Event]

    @property
    def naive(self) -> bool:
        raise NotImplementedError

    def _init_inference_slots(self, per_server: int) -> None:
        self._inf_slots = per_server
        self._inf_busy = {}
        self._inf_wait = {}
        self._arrivals = 0
        self._inf_servers = None

    def on_servers(self, servers: Sequence[str]) -> None:
        """The inference servers serving now (each brings ``inference_slots_per_server``)."""
        new = tuple(servers)
        if new == self._inf_servers:
            return
        self._inf_servers = new
        self.outbox.append(ServersChanged(kind=EventKind.SERVERS, t=self.clock.now(), servers=new))

    @property
    def inference_servers(self) -> tuple[str, ...] | None:
        """The servers declared serving (None: not declared)."""
        return self._inf_servers

    @property
    def inference_available(self) -> bool:
        """May an attempt launch as far as inference goes (a server serves, or none declared)?"""
        return self._inf_servers is None or bool(self._inf_servers)

    def request_inference(self, key: AttemptKey, server: str = "") -> bool:
        """True: granted now. False: queued; a later :meth:`release_inference` grants it."""
        busy = self._inf_busy.setdefault(server, set())
        if len(busy) < self._inf_slots:
            busy.add(key)
            return True
        self._arrivals += 1
        prio = (self._arrivals,) if self.naive else (key.seq, key.slot, key.retry, self._arrivals)
        heapq.heappush(self._inf_wait.setdefault(server, []), (prio, key))
        return False

    def release_inference(self, key: AttemptKey, server: str = "") -> list[AttemptKey]:
        """Free ``key``'s slot on ``server``; return the waiters granted in its place."""
        busy = self._inf_busy.setdefault(server, set())
        busy.discard(key)
        wait = self._inf_wait.get(server, [])
        granted = []
        while wait and len(busy) < self._inf_slots:
            _, k = heapq.heappop(wait)
            busy.add(k)
            granted.append(k)
        return granted

    def cancel_inference_wait(self, key: AttemptKey, server: str = "") -> None:
        wait = self._inf_wait.get(server, [])
        kept = [w for w in wait if w[1] != key]
        if len(kept) != len(wait):
            heapq.heapify(kept)
            self._inf_wait[server] = kept

    def inference_in_use(self, server: str = "") -> int:
        return len(self._inf_busy.get(server, ()))

    def inference_contended(self) -> bool:
        """Does any generate call wait for an inference slot?"""
        return any(self._inf_wait.values())

