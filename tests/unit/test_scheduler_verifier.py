"""Verifier slots owned by the scheduler: the group closest to complete verifies first."""

from __future__ import annotations

import asyncio

from rollbank.clock import FakeClock
from rollbank.episodes.attempt import NULL_CONTEXT
from rollbank.episodes.outcome import Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig, SchedulingMode
from rollbank.scheduling.drivers.driver import CollectionDriver
from rollbank.scheduling.drivers.fake import FakePlan, make_trajectory
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec, Launch

TASKS = ["t0", "t1", "t2"]


def _sched(mode: SchedulingMode = SchedulingMode.OPTIMIZED, slots: int | None = 1) -> tuple[
        Scheduler, dict[AttemptKey, AttemptSpec]]:
    cfg = SchedulerConfig(mode=mode, groups_per_batch=2, pool_groups=2, sandbox_slots=16,
                          verifier_slots=slots, bank=ReadyBankConfig(group_size=4))
    s = Scheduler(cfg, TASKS, FakeClock())
    specs = {d.spec.key: d.spec for d in s.poll() if isinstance(d, Launch)}
    return s, specs


def _finish(s: Scheduler, specs: dict[AttemptKey, AttemptSpec], key: AttemptKey) -> None:
    s.on_finished(key, make_trajectory(specs[key], FakePlan(Reason.VERIFIED_PASS, 1.0), now=0.0))


def _key(specs: dict[AttemptKey, AttemptSpec], seq: int, slot: int) -> AttemptKey:
    return next(k for k in specs if k.seq == seq and k.slot == slot)


def test_the_group_closest_to_complete_verifies_first_even_if_younger() -> None:
    s, specs = _sched()
    holder = _key(specs, 0, 0)
    assert s.slots.request_verifier(holder)
    _finish(s, specs, _key(specs, 1, 1))  # g1: two siblings done
    _finish(s, specs, _key(specs, 1, 2))
    old, young = _key(specs, 0, 1), _key(specs, 1, 3)
    assert not s.slots.request_verifier(old) and not s.slots.request_verifier(young)
    assert s.verifier.contended()
    # still running: g0 two (slots 2, 3; 0 and 1 are at the verifier), g1 one (slot 0)
    # -> g1 first despite its later seq
    assert s.slots.release_verifier(holder) == [young]
    assert s.slots.release_verifier(young) == [old]
    assert not s.verifier.contended()


def test_a_waiter_moves_up_when_a_sibling_finishes_while_it_waits() -> None:
    s, specs = _sched()
    holder = _key(specs, 0, 0)
    assert s.slots.request_verifier(holder)
    a, b = _key(specs, 0, 1), _key(specs, 1, 0)
    assert not s.slots.request_verifier(b) and not s.slots.request_verifier(a)
    # g0 has two siblings running, g1 three: g0 ranks first; now g1's siblings return
    _finish(s, specs, _key(specs, 1, 1))
    _finish(s, specs, _key(specs, 1, 2))
    assert s.slots.release_verifier(holder) == [b]


def test_ties_in_completion_go_to_the_older_group_and_naive_is_fifo() -> None:
    s, specs = _sched()
    assert s.slots.request_verifier(_key(specs, 0, 0))
    young, young2, old = _key(specs, 1, 0), _key(specs, 1, 1), _key(specs, 0, 1)
    assert not s.slots.request_verifier(young) and not s.slots.request_verifier(young2)
    assert not s.slots.request_verifier(old)  # two siblings still running in each group: a tie
    assert s.slots.release_verifier(_key(specs, 0, 0)) == [old]
    n, nspecs = _sched(SchedulingMode.NAIVE)
    assert n.slots.request_verifier(_key(nspecs, 0, 0))
    young, old = _key(nspecs, 1, 0), _key(nspecs, 0, 1)
    assert not n.slots.request_verifier(young) and not n.slots.request_verifier(old)
    assert n.slots.release_verifier(_key(nspecs, 0, 0)) == [young]


def test_a_retried_sibling_runs_again_and_its_group_moves_back() -> None:
    s, specs = _sched()
    assert s.slots.request_verifier(_key(specs, 0, 0))
    a, b = _key(specs, 0, 1), _key(specs, 1, 1)
    assert not s.slots.request_verifier(a)  # g0: 2 running (slots 2, 3)
    assert s.slots.request_verifier(_key(specs, 1, 0)) is False  # g1: 3 running
    assert not s.slots.request_verifier(b)  # g1: 2 running; tie with g0, g0 older
    _finish(s, specs, _key(specs, 1, 2))  # g1: 1 running -> b ranks first
    s.on_finished(_key(specs, 0, 0), make_trajectory(
        specs[_key(specs, 0, 0)], FakePlan(Reason.SANDBOX_DIED, None), now=0.0))
    # g0's slot 0 is re-run (a retry): g0 has 3 running now; b's group is closest
    assert s.slots.release_verifier(_key(specs, 0, 0))[0].group_id == "g00001"


def test_cancelled_waiter_is_skipped_and_no_limit_means_always_granted() -> None:
    s, specs = _sched(slots=2)
    a, b, c, d = (_key(specs, 0, i) for i in range(4))
    assert s.slots.request_verifier(a) and s.slots.request_verifier(b)
    assert not s.slots.request_verifier(c) and not s.slots.request_verifier(d)
    s.slots.cancel_verifier_wait(c)
    assert s.slots.release_verifier(a) == [d]
    assert s.verifier.in_use() == 2
    free, fspecs = _sched(slots=None)
    assert all(free.slots.request_verifier(k) for k in fspecs)


class _VerifyingRunner:
    """Every attempt verifies once inside the driver's verifier slot; records the peak."""

    def __init__(self) -> None:
        self.inside = 0
        self.peak = 0

    async def run(self, attempt: AttemptSpec) -> Trajectory:
        async with attempt.ctx.verifier_slot():
            self.inside += 1
            self.peak = max(self.peak, self.inside)
            await asyncio.sleep(0)
            self.inside -= 1
        return make_trajectory(attempt, FakePlan(Reason.VERIFIED_PASS, 1.0), now=0.0)


def test_driver_lends_the_verifier_slot_and_never_exceeds_it() -> None:
    runner = _VerifyingRunner()
    cfg = SchedulerConfig(groups_per_batch=2, pool_groups=3, sandbox_slots=8, verifier_slots=2,
                          num_batches=2, bank=ReadyBankConfig(group_size=4, min_valid=1))

    async def go() -> int:
        driver = CollectionDriver(cfg, runner, TASKS, clock=FakeClock())
        n = 0
        async for _ in driver.batches():
            n += 1
        return n

    assert asyncio.run(go()) == 2
    assert runner.peak == 2


def test_null_context_verifier_slot_does_nothing() -> None:
    async def go() -> bool:
        async with NULL_CONTEXT.verifier_slot():
            return True

    assert asyncio.run(go())
