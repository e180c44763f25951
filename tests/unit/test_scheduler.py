"""Scheduler stepped by hand with a FakeClock: capacities, priority, stragglers, naive mode."""

from __future__ import annotations

from typing import Any

import pytest

from rollbank.batching.batch import Batch
from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.drivers.fake import FakePlan, make_trajectory
from rollbank.scheduling.policy.events import EventKind, WasteReason
from rollbank.scheduling.policy.ledger import AttemptState
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import (
    Abort,
    AttemptKey,
    AttemptSpec,
    Decision,
    EmitBatch,
    Launch,
)

TASKS = ["t0", "t1", "t2", "t3", "t4", "t5"]


def _sched(n: int = 2, **kw: Any) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    bank = ReadyBankConfig(group_size=n, **kw.pop("bank", {}))
    return Scheduler(SchedulerConfig(bank=bank, **kw), TASKS, clock), clock


class Harness:
    """Applies decisions the way the driver does and remembers launched specs."""

    def __init__(self, sched: Scheduler) -> None:
        self.s = sched
        self.specs: dict[AttemptKey, AttemptSpec] = {}
        self.batches: list[Batch] = []
        self.aborts: list[AttemptKey] = []

    def poll(self) -> list[Decision]:
        decisions = self.s.poll()
        for d in decisions:
            if isinstance(d, Launch):
                self.specs[d.spec.key] = d.spec
            elif isinstance(d, Abort):
                self.aborts.append(d.key)
                self.s.on_aborted(d.key)
            elif isinstance(d, EmitBatch):
                self.batches.append(d.batch)
        return decisions

    def finish(self, key: AttemptKey, reason: Reason = Reason.VERIFIED_PASS,
               reward: float | None = None) -> None:
        if reward is None and reason in (Reason.VERIFIED_PASS, Reason.VERIFIED_FAIL):
            reward = float(reason is Reason.VERIFIED_PASS)
        traj = make_trajectory(self.specs[key], FakePlan(reason, reward),
                               now=self.s.clock.now())
        self.s.on_finished(key, traj)

    def finish_group(self, seq: int, rewards: tuple[float, ...] = (1.0, 0.0)) -> None:
        keys = sorted(k for k in self.s.running if k.seq == seq)
        for k, r in zip(keys, rewards, strict=True):
            self.finish(k, Reason.VERIFIED_PASS if r else Reason.VERIFIED_FAIL, r)

    def launched(self, decisions: list[Decision]) -> list[tuple[int, int, int]]:
        return [(d.spec.key.seq, d.spec.key.slot, d.spec.key.retry)
                for d in decisions if isinstance(d, Launch)]


def test_over_provisioning_admits_pool_groups_and_launches_within_sandbox_slots() -> None:
    s, _ = _sched(n=2, groups_per_batch=2, pool_groups=3, sandbox_slots=5)
    h = Harness(s)
    launched = h.launched(h.poll())
    assert launched == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0), (2, 0, 0)]
    assert len(s.running) == 5
    assert h.launched(h.poll()) == []  # capacity is full: nothing more
    assert sorted(s.bank.open_groups()) == ["g00000", "g00001", "g00002"]


def test_siblings_of_started_groups_and_retries_go_before_new_groups() -> None:
    s, _ = _sched(n=2, groups_per_batch=1, pool_groups=3, sandbox_slots=3,
                  bank={"max_retries": 1})
    h = Harness(s)
    h.poll()  # (0,0) (0,1) (1,0) running; (1,1) and (2,*) wait
    h.finish(AttemptKey(0, 0, 0, "g00000"), Reason.SANDBOX_DIED)  # -> retry of g0 slot 0
    assert h.launched(h.poll()) == [(0, 0, 1)]  # the retry outranks g1's sibling and g2
    h.finish(AttemptKey(0, 1, 0, "g00000"))
    assert h.launched(h.poll()) == [(1, 1, 0)]  # then the started group's sibling
    assert s.bank.ledger.counts()[AttemptState.RETRIED] == 1


def test_retry_keeps_the_seed_of_its_slot() -> None:
    s, _ = _sched(n=2, groups_per_batch=1, pool_groups=1, bank={"max_retries": 1})
    h = Harness(s)
    h.poll()
    first = h.specs[AttemptKey(0, 0, 0, "g00000")]
    h.finish(first.key, Reason.HOST_ERROR)
    h.poll()
    assert h.specs[AttemptKey(0, 0, 1, "g00000")].seed == first.seed


def test_trainer_takes_complete_groups_regardless_of_launch_order_under_carry() -> None:
    s, clock = _sched(n=2, groups_per_batch=2, pool_groups=4, sandbox_slots=8,
                      straggler="carry", num_batches=2)
    h = Harness(s)
    h.poll()
    clock.advance(5)
    h.finish_group(3)
    h.finish_group(1)
    h.poll()
    [b0] = h.batches
    assert [g.group_id for g in b0.groups] == ["g00001", "g00003"]
    assert b0.accounting.carried == 4 and b0.accounting.carried_running == 4
    carried = [e for e in s.drain_events() if e.kind is EventKind.CARRIED]
    assert {e.seq for e in carried} == {0, 2}  # type: ignore[attr-defined]
    assert not h.aborts
    # carried work keeps its place: the next batch takes g0 and g2 (launched first)
    h.poll()
    clock.advance(5)
    h.finish_group(0)
    h.finish_group(2)
    h.poll()
    assert [g.group_id for g in h.batches[1].groups] == ["g00000", "g00002"]
    assert s.done


def test_abort_policy_cancels_open_groups_and_requeues_them_at_their_old_place() -> None:
    s, _ = _sched(n=2, groups_per_batch=1, pool_groups=3, sandbox_slots=6,
                  straggler="abort", num_batches=2)
    h = Harness(s)
    h.poll()
    h.finish(AttemptKey(0, 0, 0, "g00000"))  # g0 half done
    h.finish_group(1)
    decisions = h.poll()
    assert sorted(k.seq for k in h.aborts) == [0, 2, 2]
    acc = h.batches[0].accounting
    assert acc.waste_by_reason == {"aborted": 4} and acc.carried == 0
    # the aborted tasks are relaunched with their original seq, ahead of new group 3
    launched = h.launched(decisions)
    assert launched[:4] == [(0, 0, 0), (0, 1, 0), (2, 0, 0), (2, 1, 0)]
    relaunched = [d.spec for d in decisions if isinstance(d, Launch)][:2]
    assert {sp.group_id for sp in relaunched} == {"g00000-q1"}
    assert all(sp.task_id == "t0" for sp in relaunched)
    s.bank.check()


def test_wait_policy_emits_only_when_no_group_of_the_pool_is_open() -> None:
    s, _ = _sched(n=2, groups_per_batch=1, pool_groups=2, straggler="wait")
    h = Harness(s)
    h.poll()
    h.finish_group(0)
    h.poll()
    assert h.batches == []  # g1 still running
    h.finish_group(1)
    h.poll()
    [b] = h.batches
    assert [g.group_id for g in b.groups] == ["g00000"]
    assert b.accounting.carried == 2 and b.accounting.carried_running == 0  # g1 waits in bank


def test_naive_mode_launches_exactly_g_groups_waits_for_all_and_never_retries() -> None:
    s, _ = _sched(n=2, mode="naive", groups_per_batch=2, pool_groups=9, num_batches=2,
                  bank={"max_retries": 3, "min_valid": 2})
    h = Harness(s)
    assert len(h.launched(h.poll())) == 4  # G = 2 groups, no over-provisioning
    h.finish(AttemptKey(0, 0, 0, "g00000"), Reason.SANDBOX_DIED)  # not re-run in naive
    assert h.launched(h.poll()) == []
    h.finish(AttemptKey(0, 1, 0, "g00000"))
    h.finish_group(1)
    decisions = h.poll()
    [b] = h.batches
    assert [g.group_id for g in b.groups] == ["g00001"]  # g0 dropped, not replaced
    assert not b.complete
    assert b.accounting.waste_by_reason == {"infra_final": 1, "group_dropped": 1}
    assert sorted({k[0] for k in h.launched(decisions)}) == [2, 3]  # next window: next G


def test_inference_slots_are_per_server_and_granted_to_older_groups_first() -> None:
    s, _ = _sched(n=2, inference_slots_per_server=1, groups_per_batch=1, pool_groups=3)
    k0, k1, k2 = (AttemptKey(i, 0, 0, f"g{i:05d}") for i in range(3))
    assert s.slots.request_inference(k2, "a")
    assert not s.slots.request_inference(k1, "a")
    assert not s.slots.request_inference(k0, "a")
    assert s.slots.request_inference(k1, "b")  # another server has its own limiter
    assert s.slots.release_inference(k2, "a") == [k0]  # older group first, not arrival order
    assert s.slots.release_inference(k0, "a") == [k1]
    assert s.inference.in_use("a") == 1


def test_naive_mode_serves_inference_first_come_first_served() -> None:
    s, _ = _sched(n=2, mode="naive", inference_slots_per_server=1, groups_per_batch=3)
    k0, k1, k2 = (AttemptKey(i, 0, 0, f"g{i:05d}") for i in range(3))
    assert s.slots.request_inference(k2)
    assert not s.slots.request_inference(k1)
    assert not s.slots.request_inference(k0)
    assert s.slots.release_inference(k2) == [k1]


def test_cancelled_inference_waiter_is_never_granted() -> None:
    s, _ = _sched(n=2, inference_slots_per_server=1)
    k0, k1 = (AttemptKey(i, 0, 0, f"g{i:05d}") for i in range(2))
    assert s.slots.request_inference(k1)
    assert not s.slots.request_inference(k0)
    s.slots.cancel_inference_wait(k0)
    assert s.slots.release_inference(k1) == []


def test_selection_profile_shows_short_first_bias() -> None:
    s, clock = _sched(n=2, groups_per_batch=1, pool_groups=2, straggler="carry", num_batches=2)
    h = Harness(s)
    h.poll()
    clock.advance(1.0)
    h.finish_group(1)  # the short group is accepted
    h.poll()
    prof = h.batches[0].profile
    assert prof.accepted_duration.mean == pytest.approx(1.0)
    assert prof.censored == 2 and prof.censored_elapsed.max == pytest.approx(1.0)
    clock.advance(9.0)
    h.finish_group(0)
    h.poll()
    # next batch: the pool now includes the long group
    assert h.batches[1].profile.pool_duration.max == pytest.approx(10.0)


def test_max_groups_exhaustion_emits_a_partial_batch_and_stops() -> None:
    s, _ = _sched(n=2, groups_per_batch=3, pool_groups=3, max_groups=2, num_batches=5)
    h = Harness(s)
    h.poll()
    h.finish_group(0)
    h.finish_group(1)
    h.poll()
    [b] = h.batches
    assert len(b.groups) == 2 and not b.complete
    assert s.done


def test_close_turns_everything_open_into_waste() -> None:
    s, _ = _sched(n=2, groups_per_batch=1, pool_groups=2)
    h = Harness(s)
    h.poll()
    s.close()
    counts = s.bank.ledger.counts()
    assert counts[AttemptState.WASTE] == 4
    reasons = {e.reason for e in s.drain_events() if e.kind is EventKind.WASTE}  # type: ignore[attr-defined]
    assert reasons == {WasteReason.UNCONSUMED_AT_CLOSE}
    s.bank.check()


@pytest.mark.parametrize("hold", [True, False])
def test_extra_groups_wait_while_inference_is_contended(hold: bool) -> None:
    s, _ = _sched(groups_per_batch=1, pool_groups=2, sandbox_slots=2,
                  inference_slots_per_server=1, hold_extras_when_contended=hold)
    h = Harness(s)
    first = [d.spec.key for d in h.poll() if isinstance(d, Launch)]
    assert [(k.seq, k.slot) for k in first] == [(0, 0), (0, 1)]  # g1 waits for a sandbox slot
    a, b = first
    assert s.slots.request_inference(a) and not s.slots.request_inference(b)  # b waits: contended
    h.finish(a)  # a sandbox slot frees; g1 is an extra group (the batch needs only g0)
    launched = [d.spec.key for d in h.poll() if isinstance(d, Launch)]
    assert [(k.seq, k.slot) for k in launched] == ([] if hold else [(1, 0)])
    assert s.holding_extras is hold and s.inference.contended()
    assert s.slots.release_inference(a) == [b]  # b runs: nobody waits any more
    assert not s.inference.contended()  # the driver polls again now (it is told to)
    launched = [d.spec.key for d in h.poll() if isinstance(d, Launch)]
    assert [(k.seq, k.slot) for k in launched] == ([(1, 0)] if hold else [])


def test_groups_the_batch_needs_launch_despite_contention() -> None:
    s, _ = _sched(groups_per_batch=2, pool_groups=3, sandbox_slots=2,
                  inference_slots_per_server=1)
    h = Harness(s)
    a, b = (d.spec.key for d in h.poll() if isinstance(d, Launch))
    assert s.slots.request_inference(a) and not s.slots.request_inference(b)
    h.finish(a)
    launched = [d.spec.key for d in h.poll() if isinstance(d, Launch)]
    assert [(k.seq, k.slot) for k in launched] == [(1, 0)]  # g1 is needed for the batch


def test_extra_groups_wait_while_verifiers_are_contended() -> None:
    clock = FakeClock()
    s = Scheduler(SchedulerConfig(bank=ReadyBankConfig(group_size=2), groups_per_batch=1,
                                  pool_groups=2, sandbox_slots=2, verifier_slots=1),
                  TASKS, clock)
    h = Harness(s)
    first = [d.spec.key for d in h.poll() if isinstance(d, Launch)]
    assert s.slots.request_verifier(first[0]) and not s.slots.request_verifier(first[1])
    s.slots.release_verifier(first[0])  # first[1] is granted; nobody waits any more
    assert not s.verifier.contended()
    assert not s.slots.request_verifier(first[0])  # a re-verify waits: verification is contended
    h.finish(first[1])  # a slot frees while verifiers are contended: g1 (extra) waits
    assert [d for d in h.poll() if isinstance(d, Launch)] == [] and s.holding_extras
    assert s.slots.release_verifier(first[1]) == [first[0]]  # contention ends
    assert [(d.spec.key.seq, d.spec.key.slot) for d in h.poll() if isinstance(d, Launch)] == [(1, 0)]


def test_a_verifier_wait_holds_extras_back_only_when_configured_to() -> None:
    """``hold_extras_for_verifier=False`` (the accelerator regime): a verifier-slot wait no
    longer holds extra groups back; an inference-slot wait still does."""
    s = Scheduler(SchedulerConfig(bank=ReadyBankConfig(group_size=2), groups_per_batch=1,
                                  pool_groups=2, sandbox_slots=2, verifier_slots=1,
                                  inference_slots_per_server=1, hold_extras_for_verifier=False),
                  TASKS, FakeClock())
    h = Harness(s)
    first = [d.spec.key for d in h.poll() if isinstance(d, Launch)]
    assert s.slots.request_verifier(first[0]) and not s.slots.request_verifier(first[1])
    assert s.verifier.contended() and not s.slots.extras_contended()
    h.finish(first[0])  # a sandbox slot frees while a verifier waits: g1 (extra) launches
    launched = [d.spec.key for d in h.poll() if isinstance(d, Launch)]
    assert [(k.seq, k.slot) for k in launched] == [(1, 0)] and not s.holding_extras
    assert s.slots.request_inference(launched[0]) and not s.slots.request_inference(first[1])
    assert s.slots.extras_contended()  # an inference wait still counts
    h.finish(launched[0])
    assert [d for d in h.poll() if isinstance(d, Launch)] == [] and s.holding_extras
