"""Starting managed servers in stages: serve as soon as the first one is healthy.

Owns :class:`StagedStart`, mixed into :class:`~rollbank.inference.server.ManagedServers`
(``wait="first"``): every server starts at once; entering returns when one is healthy; the
others join :attr:`StagedStart.ready` as they become healthy, announced by
:meth:`StagedStart.watch` (the :class:`~rollbank.inference.protocol.ServerFeed` seam the
collection driver follows). A start that fails after that is recorded and reported through
``on_failed``; only when every server failed is entering an error (the first server's).

Invariant: no start task outlives the context manager (cancelled and awaited on exit).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rollbank.inference.server import ServerState


class StagedStart:
    servers: list[ServerState]
    events: list[dict[str, object]]
    on_failed: Callable[[int, BaseException], None] | None

    @property
    def urls(self) -> list[str]:
        raise NotImplementedError

    async def _start(self, s: ServerState) -> None:
        raise NotImplementedError

    async def _stop(self, s: ServerState) -> None:
        raise NotImplementedError

    def _init_staged_start(self) -> None:
        self._starting: list[asyncio.Task[None]] = []  # starts still under way
        self._changed = asyncio.Event()  # set when a server joins or a start fails
        self.failed: dict[int, BaseException] = {}  # servers that never became healthy

    async def _start_until_first(self) -> None:
        """Start every server; return once one is healthy (the rest go on in the background);
        raise the first start error if every server failed."""
        self._starting = [asyncio.create_task(self._start_one(s), name=f"rollbank-vllm-start-{s.index}")
                          for s in self.servers]
        while not self.ready:
            if len(self.failed) == len(self.servers):
                raise self.failed[min(self.failed)]
            self._changed.clear()
            await self._changed.wait()

    async def _start_one(self, s: ServerState) -> None:
        """wait="first": start ``s``; a failure is recorded, its process stopped, not raised."""
        try:
            await self._start(s)
        except Exception as exc:
            self.failed[s.index] = exc
            self.events.append({"event": "start_failed", "server": s.index, "error": str(exc)})
            await self._stop(s)
            if self.on_failed is not None:
                self.on_failed(s.index, exc)
        finally:
            self._changed.set()

    async def _cancel_starting(self) -> None:
        for t in self._starting:
            t.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        self._starting = []

    @property
    def ready(self) -> tuple[str, ...]:
        """URLs of the servers that are serving (healthy at least once), in index order."""
        return tuple(self.urls[s.index] for s in self.servers if s.started)

    async def watch(self) -> AsyncIterator[tuple[str, ...]]:
        """The ready servers now, then again each time one joins (until every start settled)."""
        last = self.ready
        yield last
        while self._unsettled():
            self._changed.clear()
            if self.ready == last:
                await self._changed.wait()
            if self.ready != last:
                last = self.ready
                yield last

    def _unsettled(self) -> bool:
        return any(not s.started and s.index not in self.failed for s in self.servers)

    async def settled(self) -> tuple[str, ...]:
        """Wait until every server is serving or failed to start; the ready servers."""
        while self._unsettled():
            self._changed.clear()
            if self._unsettled():
                await self._changed.wait()
        return self.ready

