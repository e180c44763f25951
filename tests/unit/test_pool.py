"""WarmPool over the fake backend: one snapshot per key, stock, refills, cleanup."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rollbank.errors import SandboxError
from rollbank.sandbox.fake import FakeBackend, FakeSnapshot
from rollbank.sandbox.pool import WarmPool, WarmPoolConfig
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
