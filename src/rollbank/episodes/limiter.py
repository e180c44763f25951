"""A capacity limiter that serves waiters by priority (lowest first), not arrival.

The runner uses it for verifier slots with the scheduler's attempt priority
(``AttemptKey`` orders by group launch order, slot, retry), so when verifiers are contended
the groups launched first complete first, as the scheduler does for inference slots.

Invariants
- At most ``capacity`` holders at once; a slot is handed directly to the best waiter on
  release (no barging by later arrivals while someone waits).
- A waiter cancelled before it was granted leaves no trace; one cancelled just after it was
  granted gives its slot back.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any


class PriorityLimiter:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._free = capacity
        self._heap: list[tuple[Any, int, asyncio.Future[None]]] = []
        self._count = itertools.count()

    @property
    def in_use(self) -> int:
        return self.capacity - self._free

    @property
    def waiting(self) -> int:
        return sum(1 for *_, f in self._heap if not f.done())

    async def acquire(self, priority: Any) -> None:
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (priority, next(self._count), fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted just before the cancel: pass it on
            raise

    def release(self) -> None:
        while self._heap:
            _, _, fut = heapq.heappop(self._heap)
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1

    @asynccontextmanager
    async def slot(self, priority: Any) -> AsyncIterator[None]:
        await self.acquire(priority)
        try:
            yield
        finally:
            self.release()
