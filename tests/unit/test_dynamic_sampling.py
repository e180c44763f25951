"""Dynamic sampling in the ready bank: zero-variance groups held back, groups with variance
first, a bounded number of extra groups, then a release so a batch always comes."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.errors import ConfigError
from rollbank.scheduling.config import DynamicSamplingConfig, ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.drivers.fake import FakePlan, make_trajectory
from rollbank.scheduling.policy.events import EventKind, GroupEvent
from rollbank.scheduling.policy.ready_bank import GroupStatus, ReadyBank
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec, EmitBatch, Launch


def _ds(**kw: object) -> DynamicSamplingConfig:
    return DynamicSamplingConfig(enabled=True, **kw)  # type: ignore[arg-type]


def _bank(**kw: object) -> tuple[ReadyBank, FakeClock]:
    clock = FakeClock()
    cfg = ReadyBankConfig(group_size=2, min_valid=1, dynamic_sampling=_ds(**kw))
    return ReadyBank(cfg, clock), clock


def _complete(bank: ReadyBank, gid: str, seq: int, rewards: tuple[float, ...]) -> None:
    keys = bank.open_group(gid, "task", seq)
    for k, r in zip(keys, rewards, strict=True):
        bank.on_launched(k)
        spec = AttemptSpec(k, "task", seed=0, group_size=len(keys), launched_at=0.0)
        reason = Reason.VERIFIED_PASS if r > 0 else Reason.VERIFIED_FAIL
        bank.on_finished(k, make_trajectory(spec, FakePlan(reason, r), now=bank.clock.now()))


def test_groups_with_variance_go_first_and_held_groups_wait_for_a_release() -> None:
    bank, _ = _bank()
    _complete(bank, "g0", 0, (0.0, 0.0))  # zero variance, oldest
    bank.open_group("g9", "task", 9)  # something still open: no release yet
    _complete(bank, "g1", 1, (1.0, 0.0))
    assert bank.ready_count == 2 and bank.releasable_count == 1
    assert not bank.releasing()
    assert [g.group_id for g in bank.take(2, 0)] == ["g1"]  # g0 held, though older
    assert bank.status("g0") is GroupStatus.READY
    assert bank.hold.counts.held_at_take == 1
    # asked to release (e.g. the scheduler ran out of work): the held group fills the batch
    assert [g.group_id for g in bank.take(2, 1, release=True)] == ["g0"]
    counts = bank.hold.counts.to_dict()
    assert counts["groups_completed"] == 2 and counts["zero_variance_completed"] == 1
    assert counts["zero_variance_completed_share"] == 0.5 and counts["zero_variance_released"] == 1


def test_held_groups_are_released_when_no_group_is_open() -> None:
    bank, _ = _bank()
    _complete(bank, "g0", 0, (1.0, 1.0))
    assert bank.releasing() and bank.releasable_count == 1  # nothing open: nothing to wait for


def test_time_bound_releases_the_held_groups() -> None:
    bank, clock = _bank(max_hold_s=10.0)
    _complete(bank, "g0", 0, (0.0, 0.0))
    bank.open_group("g1", "task", 1)
    clock.advance(9.0)
    assert not bank.releasing()
    clock.advance(1.0)
    assert bank.releasing() and bank.releasable_count == 1


def test_held_groups_allow_a_bounded_number_of_extra_groups() -> None:
    bank, _ = _bank(max_extra_groups=2)
    for i in range(3):
        _complete(bank, f"g{i}", i, (0.0, 0.0))
    assert bank.extra_allowance() == 2


def test_ready_event_says_the_group_is_held() -> None:
    bank, _ = _bank()
    _complete(bank, "g0", 0, (0.0, 0.0))
    _complete(bank, "g1", 1, (0.0, 1.0))
    ready = [e for e in bank.outbox if isinstance(e, GroupEvent)]
    assert [(e.group_id, e.held) for e in ready] == [("g0", True), ("g1", False)]


def test_config_refuses_hold_and_filter_together() -> None:
    from rollbank.config import validate

    with pytest.raises(ConfigError, match="choose one"):
        validate(ReadyBankConfig, {"group_size": 2, "filter_zero_variance": True,
                                   "dynamic_sampling": {"enabled": True}}, source="test")


def _run_scheduler(config: SchedulerConfig, rewards: list[float], rng: random.Random
                   ) -> tuple[Scheduler, list[EmitBatch], int]:
    """Step the pure scheduler to the end; rewards drawn from ``rewards``. Returns the
    scheduler, the emitted batches and the most groups ever in the pool."""
    clock = FakeClock()
    s = Scheduler(config, ["a", "b"], clock)
    specs: dict[AttemptKey, AttemptSpec] = {}
    emitted: list[EmitBatch] = []
    most = 0
    for _ in range(2000):
        for d in s.poll():
            if isinstance(d, Launch):
                specs[d.spec.key] = d.spec
            elif isinstance(d, EmitBatch):
                emitted.append(d)
                s.ack(d.batch.index)
        most = max(most, s.bank.open_count + s.bank.ready_count)
        s.bank.check()
        if s.done:
            break
        assert s.running, "stalled"
        key = rng.choice(sorted(s.running))
        clock.advance(0.01 + rng.random())  # distinct times: "completed before the batch" is exact
        r = rng.choice(rewards)
        plan = FakePlan(Reason.VERIFIED_PASS if r > 0 else Reason.VERIFIED_FAIL, r)
        s.on_finished(key, make_trajectory(specs[key], plan, now=clock.now()))
    else:
        pytest.fail("did not finish")
    s.close()
    s.bank.check(full=True)
    return s, emitted, most


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(g=st.integers(1, 4), extra_pool=st.integers(0, 2), extra=st.integers(0, 3),
       n=st.integers(2, 4), batches=st.integers(1, 3), p_pass=st.sampled_from([0.0, 0.2, 0.5, 1.0]),
       rng=st.randoms(use_true_random=False))
def test_bank_never_releases_incomplete_groups_nor_loses_one(
    g: int, extra_pool: int, extra: int, n: int, batches: int, p_pass: float, rng: random.Random
) -> None:
    config = SchedulerConfig(
        groups_per_batch=g, pool_groups=g + extra_pool, sandbox_slots=6, num_batches=batches,
        max_groups=12, bank=ReadyBankConfig(group_size=n, min_valid=1, max_retries=0,
                                            dynamic_sampling=_ds(max_extra_groups=extra)))
    rewards = [1.0] * round(10 * p_pass) + [0.0] * round(10 * (1 - p_pass))
    s, emitted, most = _run_scheduler(config, rewards, rng)
    # the bound: never more than max_extra_groups groups beyond the pool
    assert most <= config.pool_groups + extra
    delivered = [grp for e in emitted for grp in e.batch.groups]
    ids = [grp.group_id for grp in delivered]
    assert len(ids) == len(set(ids))  # no group twice
    for grp in delivered:  # only complete groups: every sibling slot has its trajectory
        assert len(grp.trajectories) == n
    for e in emitted:
        # within a batch, no held group is taken while a group with variance stays behind
        if any(x.zero_variance for x in e.batch.groups):
            left = [x for x in s.returned_at_close if not x.zero_variance]
            later = [x for f in emitted if f.batch.index > e.batch.index for x in f.batch.groups]
            assert not [x for x in left + later
                        if not x.zero_variance and x.completed_at <= e.batch.ready_at]
    # every group that entered the bank was delivered or returned at close: none lost
    counts = s.bank.hold.counts
    assert counts.completed == len(delivered) + len(s.returned_at_close)
    assert counts.zero_variance == sum(x.zero_variance for x in [*delivered, *s.returned_at_close])
    # a batch always comes (a group of every sibling slot's result exists once launched)
    assert emitted


def test_default_scheduler_flow_with_all_zero_variance_still_emits() -> None:
    config = SchedulerConfig(groups_per_batch=2, pool_groups=3, sandbox_slots=4, num_batches=1,
                             bank=ReadyBankConfig(group_size=2, dynamic_sampling=_ds(max_extra_groups=2)))
    s, emitted, most = _run_scheduler(config, [0.0], random.Random(0))
    assert len(emitted) == 1 and len(emitted[0].batch.groups) == 2
    assert most == 5  # pool 3 + 2 extra groups launched to look for variance
    assert s.bank.hold.counts.completed == 5 and s.bank.hold.counts.zero_variance == 5
    assert emitted[0].batch.meta["groups"]["zero_variance_released"] == 2


def test_variance_found_by_an_extra_group_goes_in_the_batch() -> None:
    """Pool of 1: the first group has zero variance; the extra one has variance and is
    delivered instead; the held group stays in the bank."""
    clock = FakeClock()
    config = SchedulerConfig(groups_per_batch=1, pool_groups=1, sandbox_slots=2, num_batches=1,
                             bank=ReadyBankConfig(group_size=2, dynamic_sampling=_ds(max_extra_groups=1)))
    s = Scheduler(config, ["a"], clock)
    out = s.poll()
    first = [d.spec for d in out if isinstance(d, Launch)]
    for spec in first:
        s.on_finished(spec.key, make_trajectory(spec, FakePlan(Reason.VERIFIED_FAIL, 0.0), now=1.0))
    out = s.poll()
    extra = [d.spec for d in out if isinstance(d, Launch)]
    assert {sp.key.seq for sp in extra} == {1}  # an extra group replaces the held one
    assert not [d for d in out if isinstance(d, EmitBatch)]
    for spec, r in zip(extra, (1.0, 0.0), strict=True):
        reason = Reason.VERIFIED_PASS if r else Reason.VERIFIED_FAIL
        s.on_finished(spec.key, make_trajectory(spec, FakePlan(reason, r), now=2.0))
    batches = [d.batch for d in s.poll() if isinstance(d, EmitBatch)]
    assert [x.seq for x in batches[0].groups] == [1]
    assert batches[0].meta["groups"]["held_back"] == 1
    held = [e for e in s.drain_events() if isinstance(e, GroupEvent) and e.held]
    assert [e.kind for e in held] == [EventKind.GROUP_READY]


def test_scheduler_asks_to_be_woken_at_the_time_bound() -> None:
    clock = FakeClock()
    config = SchedulerConfig(groups_per_batch=1, pool_groups=1, sandbox_slots=2, num_batches=1,
                             bank=ReadyBankConfig(group_size=2, dynamic_sampling=_ds(
                                 max_extra_groups=1, max_hold_s=30.0)))
    s = Scheduler(config, ["a"], clock)
    assert s.wake_at() is None
    for d in s.poll():
        if isinstance(d, Launch):
            s.on_finished(d.spec.key, make_trajectory(d.spec, FakePlan(Reason.VERIFIED_FAIL, 0.0),
                                                      now=clock.now()))
    assert not [d for d in s.poll() if isinstance(d, EmitBatch)]  # held; the extra launched
    assert s.wake_at() == 30.0
    clock.advance(30.0)
    (batch,) = [d.batch for d in s.poll() if isinstance(d, EmitBatch)]
    assert [g.seq for g in batch.groups] == [0] and s.wake_at() is None


async def test_driver_wakes_for_the_time_bound_without_a_result() -> None:
    """The extra group never returns: only the driver's wake-up releases the held group."""
    import asyncio
    import contextlib

    from rollbank.scheduling.drivers.driver import CollectionDriver
    from rollbank.scheduling.drivers.fake import FakeAttemptRunner

    gate = asyncio.Event()  # never set: the extra group's attempts block
    runner = FakeAttemptRunner(lambda spec: FakePlan(Reason.VERIFIED_FAIL, 0.0,
                                                     gate=gate if spec.key.seq else None))
    config = SchedulerConfig(groups_per_batch=1, pool_groups=1, sandbox_slots=4, num_batches=1,
                             bank=ReadyBankConfig(group_size=2, dynamic_sampling=_ds(
                                 max_extra_groups=1, max_hold_s=0.05)))
    driver = CollectionDriver(config, runner, ["a"])

    async def first() -> list[int]:
        async with contextlib.aclosing(driver.batches()) as batches:
            async for batch in batches:
                return [g.seq for g in batch.groups]
        return []

    assert await asyncio.wait_for(first(), 20) == [0]
    assert not gate.is_set()
