"""WarmPool over the fake backend: one snapshot per key, stock, refills, cleanup."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from rollbank.errors import SandboxError
from rollbank.sandbox.config import WarmPoolConfig
from rollbank.sandbox.fake import FakeBackend, FakeSnapshot
from rollbank.sandbox.pool import WarmPool
from rollbank.sandbox.protocol import SandboxSpec

SPEC = SandboxSpec(layers=(Path("/base"),))


class CountingBackend(FakeBackend):
    def __init__(self) -> None:
        super().__init__()
        self.snapshot_calls = 0

    async def snapshot_spec(self, spec: SandboxSpec) -> FakeSnapshot:
        self.snapshot_calls += 1
        await asyncio.sleep(0)
        return await super().snapshot_spec(spec)


async def test_one_snapshot_per_key_even_when_concurrent() -> None:
    backend = CountingBackend()
    async with WarmPool(backend) as pool:
        groups = await asyncio.gather(*(pool.fork("t1", SPEC, 4) for _ in range(3)))
        await pool.fork("t2", SPEC, 1)
    assert backend.snapshot_calls == 2
    assert [len(g) for g in groups] == [4, 4, 4]
    assert len({sb.sandbox_id for g in groups for sb in g}) == 12


async def test_prestarted_stock_is_handed_out_once_and_refilled() -> None:
    backend = FakeBackend()
    async with WarmPool(backend, WarmPoolConfig(prestart=3)) as pool:
        await pool.prewarm("t", SPEC)
        assert pool.stocked("t") == 3
        stock_ids = {sb.sandbox_id for sb in backend.started}
        group = await pool.fork("t", SPEC, 4)
        assert stock_ids < {sb.sandbox_id for sb in group}
        assert pool.stats.handed_warm == 3 and pool.stats.handed_forked == 1
        for _ in range(10):
            await asyncio.sleep(0)
        assert pool.stocked("t") == 3
        other_budget = await pool.fork("t", SPEC, 2, budget_s=5.0)
        assert pool.stocked("t") == 3 and all(sb.budget_s == 5.0 for sb in other_budget)  # type: ignore[attr-defined]
    # leaving the pool closes the stock, not what was handed out
    assert all(sb.alive for sb in group)
    assert sum(1 for sb in backend.started if not sb.alive) == 3


async def test_siblings_fork_from_put_mid_episode_snapshot() -> None:
    backend = FakeBackend()
    async with WarmPool(backend) as pool:
        (first,) = await pool.fork("t", SPEC, 1)
        await first.exec("echo built > /app/expensive")
        pool.put("t", await first.snapshot())
        siblings = await pool.fork("t", SPEC, 3)
    assert [await s.read_file("/app/expensive") for s in siblings] == [b"built\n"] * 3


async def test_failed_snapshot_is_not_cached() -> None:
    class Flaky(FakeBackend):
        fails = 1

        async def snapshot_spec(self, spec: SandboxSpec) -> FakeSnapshot:
            if self.fails:
                self.fails -= 1
                raise SandboxError("boom")
            return await super().snapshot_spec(spec)

    async with WarmPool(Flaky()) as pool:
        with pytest.raises(SandboxError):
            await pool.fork("t", SPEC, 1)
        assert len(await pool.fork("t", SPEC, 2)) == 2


async def test_pool_refuses_use_outside_context() -> None:
    pool = WarmPool(FakeBackend())
    with pytest.raises(SandboxError):
        await pool.fork("t", SPEC, 1)


class GatedBackend(FakeBackend):
    """fork waits for ``fork_gate``; each sandbox's close waits for ``close_gate``."""

    def __init__(self) -> None:
        super().__init__()
        self.fork_gate = asyncio.Event()
        self.close_gate = asyncio.Event()
        self.closes_begun = 0

    async def fork(self, snapshot: Any, n: int, *, budget_s: float | None = None) -> list[Any]:
        await self.fork_gate.wait()
        group = await super().fork(snapshot, n, budget_s=budget_s)
        for sb in group:
            sb.close = self._slow_close(sb)  # type: ignore[method-assign]
        return group

    def _slow_close(self, sb: Any) -> Callable[[], Coroutine[Any, Any, None]]:
        async def close() -> None:
            self.closes_begun += 1
            await self.close_gate.wait()
            sb.closed = True

        return close


async def test_a_stale_refill_closed_while_the_pool_exits_leaves_nothing_open() -> None:
    """A refill whose snapshot went stale closes what it forked; the pool's exit (which
    cancels refills) must not cut those closes short (it left both of these open)."""
    backend = GatedBackend()
    backend.fork_gate.set()
    async with WarmPool(backend, WarmPoolConfig(prestart=2)) as pool:
        await pool.prewarm("t", SPEC)
        backend.fork_gate.clear()
        group = await pool.fork("t", SPEC, 2)  # the stock; its refill waits at the gate
        for _ in range(5):
            await asyncio.sleep(0)
        pool.put("t", await backend.snapshot_spec(SPEC))  # the refill's snapshot is stale
        backend.fork_gate.set()
        for _ in range(50):
            if backend.closes_begun:
                break
            await asyncio.sleep(0)
        assert backend.closes_begun >= 1
        backend.close_gate.set()  # the exit's cancel reaches the refill before it resumes
    # the refill's two are closed, the handed-out two are not
    assert {sb.sandbox_id for sb in backend.live} == {sb.sandbox_id for sb in group}
