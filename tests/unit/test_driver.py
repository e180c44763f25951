"""The asyncio driver with the fake runner: batches, aborts reach the runner, no leaks."""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rollbank.batching.batch import Batch
from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.errors import SchedulingError
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.drivers.driver import CollectionDriver
from rollbank.scheduling.drivers.fake import FakeAttemptRunner, FakePlan
from rollbank.scheduling.policy.events import AttemptFinished, Event, EventKind, ListSink
from rollbank.scheduling.policy.ledger import AttemptState, LedgerError
from rollbank.scheduling.policy.types import AttemptSpec


def _config(**kw: Any) -> SchedulerConfig:
    bank = ReadyBankConfig(group_size=kw.pop("n", 2), **kw.pop("bank", {}))
    return SchedulerConfig(bank=bank, **kw)


async def _collect(driver: CollectionDriver, limit: int | None = None) -> list[Batch]:
    out: list[Batch] = []
    async with contextlib.aclosing(driver.batches()) as batches:
        async for batch in batches:
            out.append(batch)
            if limit is not None and len(out) >= limit:
                break
    return out


def _alternating(spec: AttemptSpec) -> FakePlan:
    return FakePlan(Reason.VERIFIED_PASS if spec.slot % 2 else Reason.VERIFIED_FAIL,
                    reward=float(spec.slot % 2))


async def test_driver_yields_batches_and_closes_the_ledger() -> None:
    clock = FakeClock()
    runner = FakeAttemptRunner(_alternating, clock)
    sink = ListSink()
    driver = CollectionDriver(
        _config(groups_per_batch=2, pool_groups=3, sandbox_slots=4, num_batches=3),
        runner, ["a", "b"], sink=sink, clock=clock,
    )
    batches = await _collect(driver)
    assert [b.index for b in batches] == [0, 1, 2]
    assert all(b.complete and len(b.groups) == 2 for b in batches)
    bank = driver.scheduler.bank
    bank.check()
    counts = bank.ledger.counts()
    assert counts[AttemptState.IN_FLIGHT] == counts[AttemptState.FINISHED] == 0
    assert counts[AttemptState.CONSUMED] == 12
    # every runner start ended: finished or cancelled
    assert sorted(runner.finished + runner.cancelled) == sorted(runner.started)
    assert len(sink.of(EventKind.STARTED)) == len(runner.started)
    assert len(sink.of(EventKind.BATCH_READY)) == 3
    lines = [json.loads(json.dumps(e.to_dict())) for e in sink.events]  # JSONL-ready
    assert lines[0]["kind"] == "launched" and lines[-1]["kind"] == "waste"
    first_finish = next(d for d in lines if d["kind"] == "finished")
    assert first_finish["outcome"]["reason"] in ("verified_pass", "verified_fail")
    task_of_group = {g.group_id: g.task_id for b in batches for g in b.groups}
    assert task_of_group["g00000"] == "a" and task_of_group["g00001"] == "b"


async def test_abort_policy_cancels_the_runner_of_stragglers() -> None:
    clock = FakeClock()
    gate = asyncio.Event()  # never set: group 0 never finishes on its own

    def plan(spec: AttemptSpec) -> FakePlan:
        base = _alternating(spec)
        return FakePlan(base.reason, base.reward, gate=gate if spec.group_id == "g00000" else None)

    runner = FakeAttemptRunner(plan, clock)
    sink = ListSink()
    driver = CollectionDriver(
        _config(groups_per_batch=1, pool_groups=2, straggler="abort", requeue_aborted=False),
        runner, ["a"], sink=sink, clock=clock,
    )
    [batch] = await _collect(driver)
    assert [g.group_id for g in batch.groups] == ["g00001"]
    assert sorted(runner.cancelled) == ["g00000/s0/r0", "g00000/s1/r0"]
    assert batch.accounting.waste_by_reason == {"aborted": 2}
    assert {e.attempt_id for e in sink.of(EventKind.ABORTED)} == set(runner.cancelled)  # type: ignore[attr-defined]


async def test_carry_keeps_stragglers_running_into_the_next_batch() -> None:
    clock = FakeClock()
    gate = asyncio.Event()

    def plan(spec: AttemptSpec) -> FakePlan:
        base = _alternating(spec)
        return FakePlan(base.reason, base.reward, gate=gate if spec.group_id == "g00000" else None)

    runner = FakeAttemptRunner(plan, clock)
    driver = CollectionDriver(
        _config(groups_per_batch=1, pool_groups=2, straggler="carry", num_batches=2),
        runner, ["a"], clock=clock,
    )
    seen: list[list[str]] = []
    async with contextlib.aclosing(driver.batches()) as batches:
        async for batch in batches:
            seen.append([g.group_id for g in batch.groups])
            gate.set()  # the straggler may now finish, inside the next window
    assert seen == [["g00001"], ["g00000"]]
    assert not [a for a in runner.cancelled if a.startswith("g00000")]
    assert driver.batches_out[0].accounting.carried_running == 2


async def test_runner_exception_becomes_host_error_and_the_slot_is_rerun() -> None:
    clock = FakeClock()

    def plan(spec: AttemptSpec) -> FakePlan:
        base = _alternating(spec)
        boom = RuntimeError("runner bug") if spec.slot == 0 and spec.retry == 0 else None
        return FakePlan(base.reason, base.reward, raises=boom)

    sink = ListSink()
    driver = CollectionDriver(
        _config(groups_per_batch=1, pool_groups=1, bank={"max_retries": 1}),
        FakeAttemptRunner(plan, clock), ["a"], sink=sink, clock=clock,
    )
    [batch] = await _collect(driver)
    [group] = batch.groups
    assert [t.retry for t in group.trajectories] == [1, 0]
    [failed] = [e for e in sink.of(EventKind.FINISHED)
                if isinstance(e, AttemptFinished) and e.retry == 0 and e.slot == 0]
    assert failed.outcome.reason is Reason.HOST_ERROR
    assert "runner bug" in failed.outcome.evidence["error"]


async def test_inference_slots_bound_concurrent_generate_calls() -> None:
    clock = FakeClock()
    runner = FakeAttemptRunner(lambda spec: FakePlan(turns=4, server="s"), clock)
    driver = CollectionDriver(
        _config(n=4, groups_per_batch=2, pool_groups=3, sandbox_slots=12,
                inference_slots_per_server=2, bank={"min_valid": 1}),
        runner, ["a"], clock=clock,
    )
    await _collect(driver)
    assert runner.max_concurrent_inference == 2
    assert driver.scheduler.inference.in_use("s") == 0


async def test_stopping_early_cancels_everything_and_settles_it() -> None:
    clock = FakeClock()
    gate = asyncio.Event()

    def plan(spec: AttemptSpec) -> FakePlan:
        return FakePlan(gate=None if spec.group_id == "g00000" else gate)

    runner = FakeAttemptRunner(plan, clock)
    driver = CollectionDriver(
        _config(groups_per_batch=1, pool_groups=3, num_batches=5, bank={"min_valid": 1}),
        runner, ["a"], clock=clock,
    )
    batches = await _collect(driver, limit=1)
    assert len(batches) == 1
    assert sorted(runner.cancelled) == sorted(set(runner.started) - set(runner.finished))
    assert runner.cancelled  # there were stragglers to cancel
    counts = driver.scheduler.bank.ledger.counts()
    assert counts[AttemptState.IN_FLIGHT] == counts[AttemptState.FINISHED] == 0
    driver.scheduler.bank.check()
    current = asyncio.current_task()
    assert [t for t in asyncio.all_tasks() if t is not current] == []


async def test_cancelling_the_consumer_cancels_every_attempt() -> None:
    clock = FakeClock()
    gate = asyncio.Event()  # never set: no attempt finishes
    runner = FakeAttemptRunner(lambda spec: FakePlan(gate=gate), clock)
    all_started = asyncio.Event()

    class StartedSink(ListSink):
        def emit(self, event: Event) -> None:
            super().emit(event)
            if len(self.of(EventKind.STARTED)) == 4:
                all_started.set()

    driver = CollectionDriver(_config(groups_per_batch=1, pool_groups=2), runner, ["a"],
                              sink=StartedSink(), clock=clock)
    consumer = asyncio.create_task(_collect(driver))
    await all_started.wait()
    consumer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await consumer
    assert consumer.cancelled()
    assert sorted(runner.cancelled) == sorted(runner.started)
    assert driver.scheduler.bank.ledger.counts()[AttemptState.WASTE] == 4


class _ReadySink(ListSink):
    """Sets ``ready`` once ``n`` batches were emitted."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n
        self.ready = asyncio.Event()

    def emit(self, event: Event) -> None:
        super().emit(event)
        if len(self.of(EventKind.BATCH_READY)) >= self.n:
            self.ready.set()


def _three_batch_driver(sink: ListSink) -> CollectionDriver:
    clock = FakeClock()
    return CollectionDriver(
        _config(groups_per_batch=1, pool_groups=2, sandbox_slots=4, num_batches=3),
        FakeAttemptRunner(_alternating, clock), ["a"], sink=sink, clock=clock,
    )


async def test_a_consumer_that_stops_after_batch_0_consumes_batch_0_only() -> None:
    """Issue #8 defect 6 (failed on main: batches 1-2 were "consumed" and lost)."""
    sink = _ReadySink(3)
    driver = _three_batch_driver(sink)
    async with contextlib.aclosing(driver.batches()) as batches:
        async for batch in batches:
            await sink.ready.wait()  # collection ran ahead: batches 1 and 2 are emitted
            driver.ack(batch)  # the consumer took batch 0, then stops
            break
    ledger = driver.scheduler.bank.ledger
    counts = ledger.counts()
    assert counts[AttemptState.CONSUMED] == len(batch.trajectories) == 2
    assert counts[AttemptState.DELIVERED] == counts[AttemptState.FINISHED] == 0
    consumed = {k.group_id for k, e in ledger.entries.items() if e.state is AttemptState.CONSUMED}
    assert consumed == {g.group_id for g in batch.groups}
    # batches 1 and 2 were never acknowledged: their groups are back, not lost
    assert len(driver.scheduler.returned_at_close) == 2
    assert [b.index for b in driver.batches_out] == [0]
    assert len(sink.of(EventKind.BATCH_RETURNED)) == 2
    driver.scheduler.bank.check()


async def test_asking_for_the_next_batch_acknowledges_the_previous_one() -> None:
    sink = ListSink()
    driver = _three_batch_driver(sink)
    ledger = driver.scheduler.bank.ledger
    seen: list[tuple[int, int, int]] = []
    async with contextlib.aclosing(driver.batches()) as batches:
        async for batch in batches:
            mine = [e for k, e in ledger.entries.items()
                    if k.group_id in {g.group_id for g in batch.groups}]
            assert {e.state for e in mine} == {AttemptState.DELIVERED}  # not yet consumed
            counts = ledger.counts()
            seen.append((batch.index, counts[AttemptState.CONSUMED],
                         len(sink.of(EventKind.BATCH_ACKED))))
    assert seen == [(0, 0, 0), (1, 2, 1), (2, 4, 2)]
    assert ledger.counts()[AttemptState.CONSUMED] == 6  # the last one acked by the loop's end
    assert [b.index for b in driver.batches_out] == [0, 1, 2]


async def test_a_batch_is_acknowledged_by_its_directory(tmp_path: Path) -> None:
    driver = _three_batch_driver(ListSink())
    async with contextlib.aclosing(driver.batches()) as batches:
        async for batch in batches:
            path = tmp_path / "batches" / f"batch-{batch.index:06d}"
            driver.ack(path)
            with pytest.raises(SchedulingError):
                driver.ack(path)  # once only
            break
    assert driver.scheduler.bank.ledger.counts()[AttemptState.CONSUMED] == 2


async def test_a_ledger_violation_stops_the_run_with_a_typed_error() -> None:
    driver = _three_batch_driver(ListSink())
    ledger = driver.scheduler.bank.ledger
    got: list[int] = []
    with pytest.raises(LedgerError):
        async with contextlib.aclosing(driver.batches()) as batches:
            async for batch in batches:
                got.append(batch.index)
                # a bug elsewhere marks a delivered attempt consumed without a settlement
                key = next(k for k, e in ledger.entries.items()
                           if e.state is AttemptState.DELIVERED)
                ledger.entries[key].state = AttemptState.CONSUMED
    assert got == [0]  # the hand-off of batch 0 caught it; no later batch arrived


async def test_a_released_batch_is_offered_again_in_the_next_one() -> None:
    clock = FakeClock()
    gate = asyncio.Event()

    def plan(spec: AttemptSpec) -> FakePlan:
        return replace(_alternating(spec), gate=None if spec.group_id == "g00000" else gate)

    driver = CollectionDriver(
        _config(groups_per_batch=1, pool_groups=2, sandbox_slots=4, num_batches=3),
        FakeAttemptRunner(plan, clock), ["a"], clock=clock,
    )
    groups: list[list[str]] = []
    async with contextlib.aclosing(driver.batches()) as batches:
        async for batch in batches:
            groups.append([g.group_id for g in batch.groups])
            if batch.index == 0:
                driver.release(batch)  # the consumer could not use it: back to the bank
            else:
                gate.set()
    assert groups[:2] == [["g00000"], ["g00000"]]
    assert [b.index for b in driver.batches_out] == [1, 2]
    counts = driver.scheduler.bank.ledger.counts()
    assert counts[AttemptState.CONSUMED] == 4
    driver.scheduler.bank.check()
