"""PriorityLimiter: capacity, priority order, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from rollbank.episodes.limiter import PriorityLimiter


async def test_waiters_are_served_by_priority_not_arrival() -> None:
    lim = PriorityLimiter(1)
    order: list[int] = []
    gate = asyncio.Event()

    async def user(prio: int) -> None:
        async with lim.slot(prio):
            order.append(prio)
            if prio == 0:
                await gate.wait()

    first = asyncio.create_task(user(0))
    await asyncio.sleep(0)
    others = [asyncio.create_task(user(p)) for p in (5, 3, 9, 1)]
    await asyncio.sleep(0)
    assert lim.in_use == 1 and lim.waiting == 4
    gate.set()
    await asyncio.gather(first, *others)
    assert order == [0, 1, 3, 5, 9]
    assert lim.in_use == 0 and lim.waiting == 0


async def test_capacity_is_never_exceeded() -> None:
    lim = PriorityLimiter(2)
    peak = 0

    async def user(p: int) -> None:
        nonlocal peak
        async with lim.slot(p):
            peak = max(peak, lim.in_use)
            await asyncio.sleep(0)

    await asyncio.gather(*(user(p) for p in range(10)))
    assert peak == 2 and lim.in_use == 0


async def test_cancelled_waiter_leaves_no_trace() -> None:
    lim = PriorityLimiter(1)
    await lim.acquire(0)
    waiter = asyncio.create_task(lim.acquire(1))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    lim.release()
    assert lim.in_use == 0
    await asyncio.wait_for(lim.acquire(2), 1)  # the slot is free, not held by the ghost
    assert lim.in_use == 1


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError):
        PriorityLimiter(0)
