"""Randomized event orders: every launched attempt is accounted for exactly once.

Each seed draws a configuration (mode, straggler policy, capacities, retry limit, filters)
and a random order of completions and outcomes, steps the pure scheduler to the end, closes
it, and checks the ledger, the events and the batches against each other.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.scheduling.batch import Batch
from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.events import BatchEvent, Event, EventKind
from rollbank.scheduling.fake import FakePlan, make_trajectory
from rollbank.scheduling.ledger import AttemptState
from rollbank.scheduling.scheduler import Scheduler
from rollbank.scheduling.types import (
    Abort,
    AttemptKey,
    AttemptSpec,
    EmitBatch,
    Launch,
    SchedulingMode,
    StragglerPolicy,
)

OUTCOMES = [
    (Reason.VERIFIED_PASS, 1.0), (Reason.VERIFIED_FAIL, 0.0), (Reason.STEP_TIMEOUT, None),
    (Reason.SANDBOX_DIED, None), (Reason.UNATTRIBUTED, None), (Reason.VERIFIED_PASS, 0.5),
]


def _config(rng: random.Random) -> SchedulerConfig:
    n = rng.randint(1, 4)
    g = rng.randint(1, 4)
    return SchedulerConfig(
        mode=rng.choice([SchedulingMode.OPTIMIZED, SchedulingMode.OPTIMIZED, SchedulingMode.NAIVE]),
        groups_per_batch=g,
        pool_groups=g + rng.randint(0, 3),
        straggler=rng.choice(list(StragglerPolicy)),
        requeue_aborted=rng.random() < 0.7,
        sandbox_slots=rng.randint(1, 10),
        inference_slots_per_server=rng.randint(1, 4),
        num_batches=rng.randint(1, 4),
        max_groups=rng.choice([None, None, rng.randint(1, 12)]),
        bank=ReadyBankConfig(
            group_size=n,
            max_retries=rng.randint(0, 2),
            min_valid=rng.randint(1, n),
            filter_zero_variance=n >= 2 and rng.random() < 0.3,
        ),
    )


@pytest.mark.parametrize("seed", range(80))
def test_random_event_orders_account_for_every_attempt_exactly_once(seed: int) -> None:
    rng = random.Random(seed)
    config = _config(rng)
    clock = FakeClock()
    s = Scheduler(config, ["a", "b", "c"], clock)
    specs: dict[AttemptKey, AttemptSpec] = {}
    batches: list[Batch] = []
    events: list[Event] = []
    policy_aborts: list[AttemptKey] = []
    for _ in range(3000):
        for d in s.poll():
            if isinstance(d, Launch):
                assert d.spec.key not in specs
                specs[d.spec.key] = d.spec
            elif isinstance(d, Abort):
                policy_aborts.append(d.key)
                s.on_aborted(d.key)
            elif isinstance(d, EmitBatch):
                batches.append(d.batch)
        events += s.drain_events()
        assert len(s.running) <= config.sandbox_slots
        s.bank.check()
        if s.done:
            break
        assert s.running, "the scheduler stalled with nothing running"
        key = rng.choice(sorted(s.running))
        if rng.random() < 0.3:
            s.on_started(key)
        clock.advance(rng.expovariate(1.0))
        reason, reward = rng.choice(OUTCOMES)
        traj = make_trajectory(specs[key], FakePlan(reason, reward), now=clock.now())
        s.on_finished(key, traj)
        events += s.drain_events()
    else:
        pytest.fail("did not finish in 3000 steps")
    s.close()
    events += s.drain_events()
    s.bank.check()

    ledger = s.bank.ledger
    counts = ledger.counts()
    assert counts[AttemptState.IN_FLIGHT] == counts[AttemptState.FINISHED] == 0
    assert set(ledger.entries) == set(specs)  # every launch is in the ledger, once
    kinds = Counter(e.kind for e in events)
    assert kinds[EventKind.LAUNCHED] == len(specs)
    # each launched attempt ended exactly once: returned or aborted
    ended = [e.attempt_id for e in events  # type: ignore[attr-defined]
             if e.kind in (EventKind.FINISHED, EventKind.ABORTED)]
    assert sorted(ended) == sorted(k.attempt_id for k in specs)
    # settlements: consumed rows + retried + waste == launched, each matching its events
    consumed = sum(len(g.trajectories) for b in batches for g in b.groups)
    assert consumed == counts[AttemptState.CONSUMED]
    assert kinds[EventKind.RETRIED] == counts[AttemptState.RETRIED]
    assert kinds[EventKind.WASTE] == counts[AttemptState.WASTE]
    assert consumed + counts[AttemptState.RETRIED] + counts[AttemptState.WASTE] == len(specs)
    # from the event log alone: each launched attempt settles exactly once
    settled_ids = [e.attempt_id for e in events  # type: ignore[attr-defined]
                   if e.kind in (EventKind.WASTE, EventKind.RETRIED)]
    settled_ids += [a for e in events if isinstance(e, BatchEvent) for a in e.consumed]
    assert sorted(settled_ids) == sorted(k.attempt_id for k in specs)
    # per-batch accounting windows sum to the run's totals
    if batches:
        assert sum(b.accounting.consumed for b in batches) == consumed
        assert batches[-1].accounting.total_launched <= len(specs)
    seen: set[str] = set()
    for b in batches:
        assert len(b.groups) <= config.groups_per_batch
        for g in b.groups:
            assert g.group_id not in seen
            seen.add(g.group_id)
            assert len(g.trajectories) >= config.bank.min_valid
            assert all(t.outcome is not None and t.outcome.outcome.trainable
                       for t in g.trajectories)
            assert math.fsum(g.advantages) == pytest.approx(0.0, abs=1e-6)
            if config.bank.filter_zero_variance and config.mode == "optimized":
                assert not g.zero_variance
    for b in batches[:-1]:
        if config.mode == "optimized":
            assert b.complete
    if config.straggler != "abort" or config.mode == "naive":
        assert not policy_aborts
