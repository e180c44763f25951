"""Servers that finish starting after collection began: the scheduler's inference capacity
and the router's targets follow a server feed (managed servers, ``wait="first"``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.routing.config import RouterConfig
from rollbank.routing.factory import make_router, router_from_config
from rollbank.routing.router import RouteRequest, RouterPolicy
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.drivers.driver import CollectionDriver
from rollbank.scheduling.drivers.fake import FakeAttemptRunner, FakePlan
from rollbank.scheduling.policy.events import EventKind, ListSink, ServersChanged
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import Launch


def _config() -> SchedulerConfig:
    return SchedulerConfig(bank=ReadyBankConfig(group_size=2), sandbox_slots=4,
                           groups_per_batch=1, pool_groups=2, num_batches=1)


def test_no_server_serving_launches_nothing_until_one_joins() -> None:
    sched = Scheduler(_config(), ["a"], FakeClock())
    sched.on_servers(())
    assert [d for d in sched.poll() if isinstance(d, Launch)] == []
    sched.on_servers(("http://s0",))
    assert len([d for d in sched.poll() if isinstance(d, Launch)]) == 4
    sched.on_servers(("http://s0",))  # unchanged: no event
    events = [e for e in sched.drain_events() if isinstance(e, ServersChanged)]
    assert [e.servers for e in events] == [(), ("http://s0",)]
    assert all(e.kind is EventKind.SERVERS for e in events)


@pytest.mark.parametrize("policy", list(RouterPolicy))
def test_router_routes_to_a_server_that_joined(policy: RouterPolicy) -> None:
    router = make_router(policy, ["s0"], FakeClock())
    for i in range(3):  # load on s0
        router.route(RouteRequest(f"r{i}", f"t{i}", f"g{i}", [1, 2, 3]))
    router.on_server_ready("s1")
    router.on_server_ready("s1")  # known: ignored
    router.on_server_ready("s0")
    assert router.servers == ("s0", "s1")
    assert router.in_flight() == {"s0": 3, "s1": 0}
    chosen = router.route(RouteRequest("new", "t-new", "g-new", [9, 8, 7]))
    assert chosen == "s1"  # a new trajectory goes to the idle newcomer
    router.on_finish("s1", "new")
    assert router.in_flight()["s1"] == 0


class _Feed:
    """Managed servers as the test starts them."""

    def __init__(self, ready: tuple[str, ...]) -> None:
        self.ready = ready
        self._changed = asyncio.Event()
        self.done = False

    def join(self, url: str) -> None:
        self.ready = (*self.ready, url)
        self._changed.set()

    async def watch(self) -> AsyncIterator[tuple[str, ...]]:
        yield self.ready
        while not self.done:
            await self._changed.wait()
            self._changed.clear()
            yield self.ready

    async def settled(self) -> tuple[str, ...]:
        return self.ready


async def test_driver_starts_on_the_first_server_and_the_router_learns_the_next() -> None:
    feed = _Feed(())  # nothing serving yet: the driver waits instead of stalling
    gate = asyncio.Event()
    runner = FakeAttemptRunner(lambda spec: FakePlan(
        Reason.VERIFIED_PASS if spec.slot else Reason.VERIFIED_FAIL,
        reward=float(spec.slot), gate=gate))
    router = router_from_config(RouterConfig(), ["http://s0"], FakeClock())
    sink = ListSink()
    learned: list[tuple[str, ...]] = []

    def on_servers(servers: tuple[str, ...]) -> None:
        learned.append(servers)
        for url in servers:
            router.on_server_ready(url)

    driver = CollectionDriver(_config(), runner, ["a"], sink=sink, servers=feed,
                              on_servers=on_servers)

    async def consume() -> int:
        n = 0
        async with contextlib.aclosing(driver.batches()) as batches:
            async for _ in batches:
                n += 1
        return n

    task = asyncio.create_task(consume())
    for _ in range(20):
        await asyncio.sleep(0)
    assert runner.started == [] and not task.done()
    feed.join("http://s0")
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(runner.started) == 4
    feed.join("http://s1")
    for _ in range(50):
        await asyncio.sleep(0)
    assert router.servers == ("http://s0", "http://s1")
    assert driver.scheduler.inference.servers == ("http://s0", "http://s1")
    feed.done = True
    gate.set()
    assert await asyncio.wait_for(task, 10) == 1
    assert learned == [(), ("http://s0",), ("http://s0", "http://s1")]
    changes = [e.servers for e in sink.events if isinstance(e, ServersChanged)]
    assert changes == [(), ("http://s0",), ("http://s0", "http://s1")]
