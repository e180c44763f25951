"""Starting managed servers in stages: serve as soon as the first one is healthy.

Owns :class:`StagedStart`, a component owned by
:class:`~rollbank.inference.server.ManagedServers` (``wait="first"``): every server starts at
once; :meth:`StagedStart.start_until_first` returns when one is healthy; the others join
:attr:`StagedStart.ready` as they become healthy (the owner calls :meth:`StagedStart.notify`),
announced by :meth:`StagedStart.watch` (the :class:`~rollbank.inference.protocol.ServerFeed`
seam the collection driver follows). A start that fails after that is recorded, the server
stopped and reported through ``on_failed``; only when every server failed is
``start_until_first`` an error (the first server's).

It knows a server only by :class:`Startable` (its index and whether it is serving) and the
owner's ``start`` / ``stop`` / ``url`` operations.

Invariant: no start task outlives the owner's context manager (:meth:`StagedStart.cancel` is
awaited on exit).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Generic, Protocol, TypeVar


class Startable(Protocol):
    """What staged start reads of a server."""

    @property
    def index(self) -> int: ...
    @property
    def started(self) -> bool:
        """Healthy at least once."""
        ...


S = TypeVar("S", bound=Startable)


class StagedStart(Generic[S]):
    """The staged start of the owner's servers (``servers()`` is read at each use)."""

    def __init__(
        self, *, servers: Callable[[], Sequence[S]], url: Callable[[S], str],
        start: Callable[[S], Awaitable[None]], stop: Callable[[S], Awaitable[None]],
        events: list[dict[str, object]],
        on_failed: Callable[[int, BaseException], None] | None = None,
    ) -> None:
        self._servers, self._url, self._start, self._stop = servers, url, start, stop
        self.events = events
        self.on_failed = on_failed
        self._starting: list[asyncio.Task[None]] = []  # starts still under way
        self._changed = asyncio.Event()  # set when a server joins or a start fails
        self.failed: dict[int, BaseException] = {}  # servers that never became healthy

    def notify(self) -> None:
        """A server became healthy (the owner's start calls this)."""
        self._changed.set()

    async def start_until_first(self) -> None:
        """Start every server; return once one is healthy (the rest go on in the background);
        raise the first start error if every server failed."""
        servers = self._servers()
        self._starting = [asyncio.create_task(self._start_one(s), name=f"rollbank-vllm-start-{s.index}")
                          for s in servers]
        while not self.ready:
            if len(self.failed) == len(servers):
                raise self.failed[min(self.failed)]
            self._changed.clear()
            await self._changed.wait()

    async def _start_one(self, s: S) -> None:
        """Start ``s``; a failure is recorded, its process stopped, not raised."""
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

    async def cancel(self) -> None:
        """Cancel and await every start still under way."""
        for t in self._starting:
            t.cancel()
        await asyncio.gather(*self._starting, return_exceptions=True)
        self._starting = []

    @property
    def ready(self) -> tuple[str, ...]:
        """URLs of the servers that are serving (healthy at least once), in index order."""
        return tuple(self._url(s) for s in self._servers() if s.started)

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
        return any(not s.started and s.index not in self.failed for s in self._servers())

    async def settled(self) -> tuple[str, ...]:
        """Wait until every server is serving or failed to start; the ready servers."""
        while self._unsettled():
            self._changed.clear()
            if self._unsettled():
                await self._changed.wait()
        return self.ready
