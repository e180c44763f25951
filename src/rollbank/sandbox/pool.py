"""Warm pool: a ready snapshot per key (task) and optionally pre-started sandboxes.

Owns :class:`WarmPool` and :class:`WarmPoolConfig`. ``await pool.fork(key, spec, n)`` returns
``n`` sibling sandboxes of the key's snapshot (one GRPO group): pre-started ones first, the
rest forked on demand; the stock is refilled in the background by tasks of a
:class:`asyncio.TaskGroup` the pool owns (``async with WarmPool(...) as pool``).

Invariants
- One snapshot per key, made once even when many callers ask at the same time; a failed
  snapshot is not cached (the next caller retries).
- Pre-started sandboxes are handed out at most once and only to callers asking for the
  pool's budget (a started sandbox's budget cannot change).
- Leaving the ``async with`` cancels refills and closes every sandbox still in stock;
  sandboxes handed out belong to the caller.
- Concurrency is bounded: at most ``max_refills`` refills run at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from rollbank.errors import SandboxError
from rollbank.sandbox.config import WarmPoolConfig
from rollbank.sandbox.protocol import Sandbox, SandboxBackend, SandboxSpec, Snapshot


@dataclass
class PoolStats:
    snapshots: int = 0
    handed_warm: int = 0  # sandboxes handed out from stock
    handed_forked: int = 0  # sandboxes forked on demand
    refill_errors: int = 0


class WarmPool:
    """See module docstring."""

    def __init__(self, backend: SandboxBackend, config: WarmPoolConfig | None = None) -> None:
        self.backend = backend
        self.config = config or WarmPoolConfig()
        self.stats = PoolStats()
        self._snaps: dict[str, asyncio.Future[Snapshot]] = {}
        self._stock: dict[str, list[Sandbox]] = {}
        self._refilling: dict[str, asyncio.Task[None]] = {}  # key -> its running refill
        self._tg: asyncio.TaskGroup | None = None
        self._refill_sem = asyncio.Semaphore(self.config.max_refills)
        self._closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._closers: set[asyncio.Task[None]] = set()  # sb.close() tasks: awaited, not cancelled

    async def __aenter__(self) -> WarmPool:
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._closing = True
        assert self._tg is not None
        for task in list(self._tasks):
            if task not in self._closers:
                task.cancel()
        try:
            await self._tg.__aexit__(t, e, tb)
        finally:
            for stock in self._stock.values():
                for sb in stock:
                    with contextlib.suppress(Exception):
                        await sb.close()
            self._stock.clear()
            self._tg = None

    # ---------------------------------------------------------------- snapshots
    async def snapshot(self, key: str, spec: SandboxSpec) -> Snapshot:
        """The key's snapshot, made from ``spec`` the first time."""
        fut = self._snaps.get(key)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._snaps[key] = fut
            try:
                snap = await self.backend.snapshot_spec(spec)
            except BaseException as exc:
                del self._snaps[key]
                fut.set_exception(exc)
                fut.exception()  # retrieved: waiters re-raise it, nobody logs it as lost
                raise
            self.stats.snapshots += 1
            fut.set_result(snap)
            return snap
        return await asyncio.shield(fut)

    def put(self, key: str, snapshot: Snapshot) -> None:
        """Use ``snapshot`` (e.g. a mid-episode state) for ``key`` from now on."""
        fut: asyncio.Future[Snapshot] = asyncio.get_running_loop().create_future()
        fut.set_result(snapshot)
        self._snaps[key] = fut
        self._drop_stock(key)

    def invalidate(self, key: str) -> None:
        self._snaps.pop(key, None)
        self._drop_stock(key)

    def _drop_stock(self, key: str) -> None:
        for sb in self._stock.pop(key, []):
            self._close_later(sb)

    def _close_later(self, sb: Sandbox) -> None:
        task = self._spawn(sb.close())
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    # ---------------------------------------------------------------- fork
    async def fork(
        self, key: str, spec: SandboxSpec, n: int, *, budget_s: float | None = None
    ) -> list[Sandbox]:
        """``n`` sibling sandboxes of the key's snapshot (stock first, then forked)."""
        if self._tg is None or self._closing:
            raise SandboxError("WarmPool used outside 'async with'")
        snap = await self.snapshot(key, spec)
        out: list[Sandbox] = []
        if budget_s == self.config.budget_s:
            stock = self._stock.get(key, [])
            while stock and len(out) < n:
                sb = stock.pop()
                if sb.alive:
                    out.append(sb)
                else:
                    self._close_later(sb)
        warm = len(out)
        if warm < n:
            try:
                out += await self.backend.fork(snap, n - warm, budget_s=budget_s)
            except BaseException:
                for sb in out:
                    await sb.close()
                raise
        self.stats.handed_warm += warm
        self.stats.handed_forked += n - warm
        self._schedule_refill(key, snap)
        return out

    def _schedule_refill(self, key: str, snap: Snapshot) -> None:
        if self.config.prestart == 0 or key in self._refilling or self._closing:
            return
        self._refilling[key] = self._spawn(self._refill(key, snap))

    async def _refill(self, key: str, snap: Snapshot) -> None:
        try:
            async with self._refill_sem:
                have = len(self._stock.get(key, []))
                need = self.config.prestart - have
                if need <= 0:
                    return
                try:
                    new = await self.backend.fork(snap, need, budget_s=self.config.budget_s)
                except SandboxError:
                    self.stats.refill_errors += 1
                    return
                current = self._snaps.get(key)
                if self._closing or current is None or not current.done() or (
                    current.result() is not snap
                ):
                    # close tasks the pool's exit awaits and never cancels: awaited here, a
                    # close cut by that exit's cancel left this sandbox and the next open
                    for sb in new:
                        self._close_later(sb)
                    return
                self._stock.setdefault(key, []).extend(new)
        finally:
            self._refilling.pop(key, None)

    async def prewarm(self, key: str, spec: SandboxSpec) -> None:
        """Make the key's snapshot and fill its stock now (waits for the refill)."""
        snap = await self.snapshot(key, spec)
        running = self._refilling.get(key)
        if running is not None:
            await asyncio.wait({running})
        if self.config.prestart and self.stocked(key) < self.config.prestart:
            task = self._spawn(self._refill(key, snap))
            self._refilling[key] = task
            await asyncio.wait({task})

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        assert self._tg is not None
        task = self._tg.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def stocked(self, key: str) -> int:
        return len(self._stock.get(key, []))
