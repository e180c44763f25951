"""The ledger's incremental bookkeeping (unsettled set, pool statistics, checks) agrees with
a recomputation from every entry."""

from __future__ import annotations

import heapq
import math
import random

import pytest

from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig, StragglerPolicy
from rollbank.scheduling.policy.events import WasteReason
from rollbank.scheduling.policy.ledger import FINAL, AttemptState, Ledger, LedgerError
from rollbank.scheduling.policy.profile import dist
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import (
    Abort,
    AttemptKey,
    AttemptSpec,
    EmitBatch,
    Launch,
)
from rollbank.scheduling.sim.sim_model import SimCapacity
from rollbank.scheduling.sim.simulate import SimEpisode, _Sim


def _workload(spec: AttemptSpec) -> SimEpisode:
    rng = random.Random(spec.seed * 7 + spec.retry)
    d = math.exp(rng.gauss(0.0, 1.0))
    if rng.random() < 0.1:
        return SimEpisode(d / 2, Reason.SANDBOX_DIED, None)
    ok = rng.random() < 0.5
    return SimEpisode(d, Reason.VERIFIED_PASS if ok else Reason.VERIFIED_FAIL, float(ok))


def test_pool_and_unsettled_match_a_recomputation_after_an_abort_run() -> None:
    cfg = SchedulerConfig(groups_per_batch=4, pool_groups=8, sandbox_slots=12, num_batches=5,
                          straggler=StragglerPolicy.ABORT,
                          bank=ReadyBankConfig(group_size=3, max_retries=1))
    sched = Scheduler(cfg, [f"t{i}" for i in range(5)], FakeClock())
    led = _drive(sched)
    entries = list(led.entries.values())
    valid = sorted(e.duration_s for e in entries if e.valid and e.duration_s is not None)
    assert led.pool.duration_stats() == dist(valid)  # pool.py: kept incrementally
    aborted = sorted(e.held_s(0.0) for e in entries if e.finished_at is None
                     and e.waste_reason is WasteReason.ABORTED)
    assert led.pool.aborted_held() == aborted and aborted
    assert led.unsettled() == [e for e in entries if e.state not in FINAL]
    led.check(full=True)


def _drive(sched: Scheduler) -> Ledger:
    """Step ``sched`` with the simulator's event loop; return its (open) ledger."""
    clock = sched.clock
    assert isinstance(clock, FakeClock)
    sim = _Sim(sched, SimCapacity(), clock)
    while True:
        if sim.wake:
            sim.wake = False
            for d in sched.poll():
                if isinstance(d, Launch):
                    sim.launch(d.spec, _workload(d.spec), clock.now())
                elif isinstance(d, Abort):
                    sim.abort(d.key, clock.now())
                elif isinstance(d, EmitBatch):
                    sched.ack(d.batch.index)
        if sched.done or not sim.heap:
            break
        t, n, phase, key = heapq.heappop(sim.heap)
        clock.set(t)
        sim.dispatch(t, n, phase, key)
    return sched.bank.ledger


def _ledger_with_one_consumed() -> tuple[Ledger, AttemptKey, AttemptKey]:
    led = Ledger()
    a, b = AttemptKey(0, 0, 0, "g"), AttemptKey(0, 1, 0, "g")
    for k in (a, b):
        led.launch(k, "t", 0.0)
        led.finish(k, 1.0, model_tokens=1, reward=1.0, valid=True)
    led.deliver(a, 1.0)
    led.settle(a, AttemptState.CONSUMED, 1.0)
    led.check()
    return led, a, b


def test_incremental_check_catches_an_open_attempt_marked_final() -> None:
    led, _, b = _ledger_with_one_consumed()
    led.entries[b].state = AttemptState.CONSUMED  # no settlement recorded
    with pytest.raises(LedgerError):
        led.check()


def test_full_check_catches_a_settled_attempt_changed_after_it_was_checked() -> None:
    led, a, _ = _ledger_with_one_consumed()
    led.entries[a].state = AttemptState.DELIVERED  # corrupt an already checked settlement
    led.check()  # the incremental check looks at new settlements only
    with pytest.raises(LedgerError):
        led.check(full=True)
