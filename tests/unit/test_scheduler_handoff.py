"""Issue #8 defects 4, 6 and 7 at the level of the pure scheduler.

- 4: under ``abort`` the selection profile shows aborted attempts as censored; a re-queue cap
  records a task unreachable within the budget; the pool holds valid attempts only.
- 6: a batch is consumed only when acknowledged; unacknowledged batches go back to the bank.
- 7: a poll never launches an attempt and aborts it in the same breath.
"""

from __future__ import annotations

import pytest

from rollbank.batching.batch import Unreachable
from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.errors import RollbankError, SchedulingError
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig, StragglerPolicy
from rollbank.scheduling.drivers.fake import FakePlan, make_trajectory
from rollbank.scheduling.policy.events import Event, EventKind, TaskUnreachable
from rollbank.scheduling.policy.ledger import AttemptState, LedgerError
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import (
    Abort,
    AttemptKey,
    AttemptSpec,
    EmitBatch,
    Launch,
)
from rollbank.scheduling.sim.simulate import SimEpisode, simulate

ABORT = StragglerPolicy.ABORT


def _short_and_long(spec: AttemptSpec) -> SimEpisode:
    """The 1 s / 5 s workload of the issue: every slot of a task takes the same time."""
    return SimEpisode(1.0 if spec.task_id == "short" else 5.0,
                      Reason.VERIFIED_PASS if spec.slot % 2 else Reason.VERIFIED_FAIL,
                      float(spec.slot % 2))


def _abort_config(**kw: object) -> SchedulerConfig:
    return SchedulerConfig.model_validate({
        "groups_per_batch": 1, "pool_groups": 2, "sandbox_slots": 4, "straggler": ABORT,
        "num_batches": 3, "bank": ReadyBankConfig(group_size=2), **kw,
    })


def test_aborted_attempts_are_censored_observations_in_the_selection_profile() -> None:
    """Defect 4 (failed on main: censored=0, the 5 s task invisible)."""
    result = simulate(_abort_config(max_requeues=None), ["short", "long"], _short_and_long)
    first, last = result.batches[0], result.batches[-1]
    # at t=1 the long group (2 attempts, 1 s elapsed) is aborted for batch 0
    assert first.profile.censored == 2 and first.profile.censored_aborted == 2
    assert first.profile.censored_elapsed.max == 1.0
    assert first.profile.pool_duration.max == 1.0  # finished attempts: only the short ones
    # the run's aborts accumulate: every aborted attempt stays in the profile
    assert last.profile.censored_aborted == 2 * len(result.batches)


def test_requeue_cap_records_the_task_unreachable_and_reports_it() -> None:
    """Defect 4: without a cap the long task was re-queued at every batch, without limit."""
    events: list[Event] = []
    result = simulate(_abort_config(max_requeues=1), ["short", "long"], _short_and_long,
                      events=events)
    expected = Unreachable(task_id="long", group_id="g00001-q1", seq=1, requeues=1,
                           longest_elapsed_s=1.0)
    assert result.batches[0].unreachable == ()
    assert result.batches[1].unreachable == (expected,)
    [event] = [e for e in events if e.kind is EventKind.TASK_UNREACHABLE]
    assert isinstance(event, TaskUnreachable) and event.group_id == "g00001-q1"
    assert expected in result.unreachable
    launched_groups = {e.group_id for e in events if e.kind is EventKind.LAUNCHED}  # type: ignore[attr-defined]
    assert "g00001-q2" not in launched_groups  # not re-queued past the cap


def test_pool_profile_counts_valid_attempts_only() -> None:
    """Defect 4: an infra attempt re-run in its slot is not part of the pool."""
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(groups_per_batch=1, pool_groups=1,
                                  bank=ReadyBankConfig(group_size=1, min_valid=1,
                                                       max_retries=1)), ["t"], clock)
    specs: dict[AttemptKey, AttemptSpec] = {}
    batches = []

    def poll() -> None:
        for d in s.poll():
            if isinstance(d, Launch):
                specs[d.spec.key] = d.spec
            elif isinstance(d, EmitBatch):
                batches.append(d.batch)

    poll()
    clock.advance(9.0)  # a slow infra failure ...
    [key] = s.running
    s.on_finished(key, make_trajectory(specs[key], FakePlan(Reason.SANDBOX_DIED, None),
                                       now=clock.now()))
    poll()
    clock.advance(1.0)  # ... re-run quickly and validly
    [key] = s.running
    s.on_finished(key, make_trajectory(specs[key], FakePlan(), now=clock.now()))
    poll()
    [batch] = batches
    assert batch.profile.pool_duration.n == 1 and batch.profile.pool_duration.max == 1.0
    assert batch.profile.accepted_duration == batch.profile.pool_duration


def test_a_poll_never_launches_and_aborts_the_same_attempt() -> None:
    """Defect 7 (failed on main: g1's slot 1 was launched and aborted in one poll)."""
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(groups_per_batch=1, pool_groups=2, sandbox_slots=2,
                                  straggler=ABORT, num_batches=2,
                                  bank=ReadyBankConfig(group_size=2)), ["t"], clock)
    specs: dict[AttemptKey, AttemptSpec] = {}
    waste_launches = 0
    for _ in range(20):
        decisions = s.poll()
        launched = {d.spec.key for d in decisions if isinstance(d, Launch)}
        aborted = {d.key for d in decisions if isinstance(d, Abort)}
        waste_launches += len(launched & aborted)
        for d in decisions:
            if isinstance(d, Launch):
                specs[d.spec.key] = d.spec
            elif isinstance(d, Abort):
                s.on_aborted(d.key)
            elif isinstance(d, EmitBatch):
                s.ack(d.batch.index)
        if s.done:
            break
        key = min(s.running)  # oldest first: g0 finishes slot by slot, g1 lags behind
        clock.advance(1.0)
        s.on_finished(key, make_trajectory(specs[key], FakePlan(
            Reason.VERIFIED_PASS if key.slot else Reason.VERIFIED_FAIL, float(key.slot)),
            now=clock.now()))
    assert s.done
    assert waste_launches == 0


def _one_batch_ready(num_batches: int = 2) -> tuple[Scheduler, list[int]]:
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(groups_per_batch=1, pool_groups=1, num_batches=num_batches,
                                  bank=ReadyBankConfig(group_size=2)), ["t"], clock)
    specs: dict[AttemptKey, AttemptSpec] = {}
    emitted: list[int] = []
    while not s.done:
        for d in s.poll():
            if isinstance(d, Launch):
                specs[d.spec.key] = d.spec
            elif isinstance(d, EmitBatch):
                emitted.append(d.batch.index)
        for key in sorted(s.running):
            s.on_finished(key, make_trajectory(specs[key], FakePlan(
                Reason.VERIFIED_PASS if key.slot else Reason.VERIFIED_FAIL, float(key.slot)),
                now=clock.now()))
    return s, emitted


def test_batches_are_consumed_only_when_acknowledged() -> None:
    """Defect 6 (failed on main: groups were consumed when the bank handed them out)."""
    s, emitted = _one_batch_ready()
    assert emitted == [0, 1]
    ledger = s.bank.ledger
    assert ledger.counts()[AttemptState.CONSUMED] == 0
    assert ledger.counts()[AttemptState.DELIVERED] == 4
    s.ack(0)
    assert ledger.counts()[AttemptState.CONSUMED] == 2
    s.close()  # batch 1 never acknowledged: back to the bank, not consumed
    counts = ledger.counts()
    assert counts[AttemptState.CONSUMED] == 2 and counts[AttemptState.WASTE] == 2
    assert [g.group_id for g in s.returned_at_close] == ["g00001"]
    kinds = [e.kind for e in s.drain_events()]
    assert kinds.count(EventKind.BATCH_ACKED) == 1 and kinds.count(EventKind.BATCH_RETURNED) == 1


def test_acknowledging_twice_is_a_typed_error() -> None:
    s, _ = _one_batch_ready(num_batches=1)
    s.ack(0)
    with pytest.raises(LedgerError) as info:
        s.ack(0)
    assert isinstance(info.value, SchedulingError) and isinstance(info.value, RollbankError)
