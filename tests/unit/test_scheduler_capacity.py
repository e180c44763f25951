"""Sandbox capacity as an input event: the scheduler and the driver follow a changing cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.drivers.driver import CollectionDriver
from rollbank.scheduling.drivers.fake import FakeAttemptRunner, FakePlan, make_trajectory
from rollbank.scheduling.policy.events import CapacityChanged, EventKind, ListSink
from rollbank.scheduling.policy.inference_slots import InferenceSlots
from rollbank.scheduling.policy.sandbox_slots import SandboxSlots
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec, Launch


def _config(slots: int = 2, **kw: int) -> SchedulerConfig:
    return SchedulerConfig(bank=ReadyBankConfig(group_size=2), sandbox_slots=slots,
                           groups_per_batch=kw.get("groups", 2), pool_groups=kw.get("pool", 4),
                           num_batches=kw.get("batches", 1))


def _launches(sched: Scheduler) -> list[AttemptSpec]:
    return [d.spec for d in sched.poll() if isinstance(d, Launch)]


def test_capacity_growth_launches_more_at_the_next_poll() -> None:
    sched = Scheduler(_config(slots=2), ["a", "b"], FakeClock())
    assert len(_launches(sched)) == 2
    assert _launches(sched) == []
    sched.on_capacity(5)
    assert len(_launches(sched)) == 3
    assert len(sched.running) == 5
    (event,) = [e for e in sched.drain_events() if e.kind is EventKind.CAPACITY]
    assert isinstance(event, CapacityChanged) and event.sandbox_slots == 5


def test_capacity_drop_aborts_nothing_and_gates_launches_until_below() -> None:
    clock = FakeClock()
    sched = Scheduler(_config(slots=4), ["a", "b"], clock)
    running = _launches(sched)
    assert len(running) == 4
    sched.on_capacity(1)
    # nothing aborted; finishing 2 of 4 leaves 2 running, still above 1: nothing launches
    decisions = sched.poll()
    assert decisions == []
    for spec in running[:2]:
        sched.on_finished(spec.key, make_trajectory(spec, FakePlan(Reason.VERIFIED_PASS),
                                                    now=clock.now()))
    assert [d for d in sched.poll() if isinstance(d, Launch)] == []
    assert len(sched.running) == 2
    sched.on_capacity(0)  # no node left: still nothing launches, nothing is aborted
    assert sched.sandbox_slots == 0 and len(sched.running) == 2


class _Counted(InferenceSlots):
    """An injected inference capacity that counts what the scheduler asks of it."""

    def __init__(self) -> None:
        super().__init__(1)
        self.requests: list[tuple[AttemptKey, str]] = []

    def request(self, key: AttemptKey, server: str) -> bool:
        self.requests.append((key, server))
        return super().request(key, server)


def test_the_scheduler_uses_the_capacities_it_is_given_not_its_configs() -> None:
    sandbox, inference = SandboxSlots(1), _Counted()
    sched = Scheduler(_config(slots=4), ["a", "b"], FakeClock(), sandbox=sandbox,
                      inference=inference)
    (first,) = _launches(sched)  # the given 1 slot, not the config's 4
    sched.on_capacity(3)
    assert sandbox.slots == 3 and len(_launches(sched)) == 2
    assert sched.slots.request_inference(first.key, "s") and inference.requests == [(first.key, "s")]
    assert not sched.slots.request_inference(AttemptKey(9, 0, 0, "g9"), "s")  # 1 slot per server
    assert sched.slots.extras_contended()  # the given capacity's wait counts
    sched.on_servers(())  # declared, none serving: nothing more launches
    sched.on_capacity(10)
    assert _launches(sched) == []


def test_unchanged_capacity_records_no_event() -> None:
    sched = Scheduler(_config(slots=3), ["a"], FakeClock())
    sched.on_capacity(3)
    assert not [e for e in sched.drain_events() if e.kind is EventKind.CAPACITY]


class _Feed:
    """A cluster whose slots the test changes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._changed = asyncio.Event()

    def set(self, capacity: int) -> None:
        self.capacity = capacity
        self._changed.set()

    async def watch(self) -> AsyncIterator[int]:
        while True:
            yield self.capacity
            await self._changed.wait()
            self._changed.clear()


async def test_driver_follows_the_feed_and_waits_at_zero_instead_of_stalling() -> None:
    feed = _Feed(0)  # no node yet: the driver must wait, not raise CollectionStalledError
    gate = asyncio.Event()
    runner = FakeAttemptRunner(lambda spec: FakePlan(
        Reason.VERIFIED_PASS if spec.slot else Reason.VERIFIED_FAIL,
        reward=float(spec.slot), gate=gate))
    sink = ListSink()
    driver = CollectionDriver(_config(slots=64), runner, ["a", "b"], sink=sink, capacity=feed)
    assert driver.scheduler.sandbox_slots == 0  # the feed, not the config, sets the slots

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
    feed.set(3)
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(runner.started) == 3  # exactly the new capacity, not the config's 64
    feed.set(8)
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(runner.started) == 8
    gate.set()
    assert await asyncio.wait_for(task, 10) == 1
    slots = [e.sandbox_slots for e in sink.events if isinstance(e, CapacityChanged)]
    assert slots == [0, 3, 8]  # the config's 64 replaced by the feed at start
