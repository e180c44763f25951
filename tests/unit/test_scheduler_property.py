"""Property: under any event order, every launched attempt is accounted for exactly once.

Hypothesis draws a configuration (mode, straggler policy, capacities, retry limit, filters,
re-queue cap), a random order of completions and outcomes, and what the consumer does with
each batch (acknowledge now, later, never, or hand it back); the pure scheduler is stepped
to the end and closed, and the ledger, the events and the batches are checked against each
other.
"""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollbank.batching.batch import Batch
from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.scheduling.config import (
    DynamicSamplingConfig,
    ReadyBankConfig,
    SchedulerConfig,
    SchedulingMode,
    StragglerPolicy,
)
from rollbank.scheduling.drivers.fake import FakePlan, make_trajectory
from rollbank.scheduling.policy.events import BatchEvent, BatchHandoff, Event, EventKind
from rollbank.scheduling.policy.ledger import AttemptState
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import (
    Abort,
    AttemptKey,
    AttemptSpec,
    EmitBatch,
    Launch,
)

OUTCOMES = [
    (Reason.VERIFIED_PASS, 1.0), (Reason.VERIFIED_FAIL, 0.0), (Reason.STEP_TIMEOUT, None),
    (Reason.SANDBOX_DIED, None), (Reason.UNATTRIBUTED, None), (Reason.VERIFIED_PASS, 0.5),
]


@st.composite
def configs(draw: st.DrawFn) -> SchedulerConfig:
    n = draw(st.integers(1, 4))
    g = draw(st.integers(1, 4))
    return SchedulerConfig(
        mode=draw(st.sampled_from([SchedulingMode.OPTIMIZED, SchedulingMode.OPTIMIZED,
                                   SchedulingMode.NAIVE])),
        groups_per_batch=g,
        pool_groups=g + draw(st.integers(0, 3)),
        straggler=draw(st.sampled_from(list(StragglerPolicy))),
        requeue_aborted=draw(st.booleans()),
        max_requeues=draw(st.one_of(st.none(), st.integers(0, 3))),
        sandbox_slots=draw(st.integers(1, 10)),
        inference_slots_per_server=draw(st.integers(1, 4)),
        num_batches=draw(st.integers(1, 4)),
        max_groups=draw(st.one_of(st.none(), st.integers(1, 12))),
        bank=ReadyBankConfig(
            group_size=n,
            max_retries=draw(st.integers(0, 2)),
            min_valid=draw(st.integers(1, n)),
            filter_zero_variance=(zv := _zero_variance_policy(draw, n))[0],
            dynamic_sampling=zv[1],
        ),
    )


def _zero_variance_policy(draw: st.DrawFn, n: int) -> tuple[bool, DynamicSamplingConfig]:
    """Keep zero-variance groups, drop them (filter), or hold them back (dynamic sampling)."""
    choice = draw(st.sampled_from(["keep", "filter", "hold"])) if n >= 2 else "keep"
    if choice == "hold":
        hold_s = draw(st.one_of(st.none(), st.floats(0.5, 5.0)))
        return False, DynamicSamplingConfig(
            enabled=True, max_extra_groups=draw(st.integers(0, 3)), max_hold_s=hold_s)
    return choice == "filter", DynamicSamplingConfig()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=configs(), rng=st.randoms(use_true_random=False))
def test_any_event_order_accounts_for_every_attempt_exactly_once(
    config: SchedulerConfig, rng: random.Random
) -> None:
    clock = FakeClock()
    s = Scheduler(config, ["a", "b", "c"], clock)
    specs: dict[AttemptKey, AttemptSpec] = {}
    batches: list[Batch] = []
    events: list[Event] = []
    policy_aborts: list[AttemptKey] = []
    pending: list[int] = []  # emitted batches the consumer has not answered yet
    acked: list[Batch] = []
    launched_this_poll: set[AttemptKey] = set()
    for _ in range(3000):
        launched_this_poll.clear()
        for d in s.poll():
            if isinstance(d, Launch):
                assert d.spec.key not in specs
                specs[d.spec.key] = d.spec
                launched_this_poll.add(d.spec.key)
            elif isinstance(d, Abort):
                assert d.key not in launched_this_poll, "launched and aborted in one poll"
                policy_aborts.append(d.key)
                s.on_aborted(d.key)
            elif isinstance(d, EmitBatch):
                batches.append(d.batch)
                pending.append(d.batch.index)
        released = False
        for index in list(pending):  # the consumer: ack now, later, never, or hand back
            choice = rng.random()
            if choice < 0.6:
                s.ack(index)
                acked.append(next(b for b in batches if b.index == index))
                pending.remove(index)
            elif choice < 0.7 and not s.done:
                s.release(index)
                pending.remove(index)
                released = True
        events += s.drain_events()
        assert len(s.running) <= config.sandbox_slots
        s.bank.check()
        if s.done:
            break
        if not s.running:
            assert released, "the scheduler stalled with nothing running"
            continue  # handed-back groups may make a batch due: poll again

        key = rng.choice(sorted(s.running))
        if rng.random() < 0.3:
            s.on_started(key)
        clock.advance(3.0 * rng.random())
        reason, reward = rng.choice(OUTCOMES)
        traj = make_trajectory(specs[key], FakePlan(reason, reward), now=clock.now())
        s.on_finished(key, traj)
        events += s.drain_events()
    else:
        pytest.fail("did not finish in 3000 steps")
    s.close()
    events += s.drain_events()
    s.bank.check()
    assert not s.unacknowledged()  # every batch answered: acked, or returned at close

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
    # (only acknowledged batches are consumed; the others went back and became waste)
    consumed = sum(len(g.trajectories) for b in acked for g in b.groups)
    assert consumed == counts[AttemptState.CONSUMED]
    assert kinds[EventKind.RETRIED] == counts[AttemptState.RETRIED]
    assert kinds[EventKind.WASTE] == counts[AttemptState.WASTE]
    assert consumed + counts[AttemptState.RETRIED] + counts[AttemptState.WASTE] == len(specs)
    # from the event log alone: each launched attempt settles exactly once
    settled_ids = [e.attempt_id for e in events  # type: ignore[attr-defined]
                   if e.kind in (EventKind.WASTE, EventKind.RETRIED)]
    settled_ids += [a for e in events if isinstance(e, BatchHandoff)
                    and e.kind is EventKind.BATCH_ACKED for a in e.attempt_ids]
    assert sorted(settled_ids) == sorted(k.attempt_id for k in specs)
    # per-batch accounting windows sum to the run's totals
    delivered = [a for e in events if isinstance(e, BatchEvent) for a in e.delivered]
    if batches:
        assert sum(b.accounting.consumed for b in batches) == len(delivered)
        assert batches[-1].accounting.total_launched <= len(specs)
    seen: set[str] = set()
    for b in batches:
        assert len(b.groups) <= config.groups_per_batch
    for b in acked:
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
    if not config.requeue_aborted or config.straggler != "abort":
        assert not s.unreachable
    for u in s.unreachable:
        assert config.max_requeues is not None and u.requeues == config.max_requeues
    if config.straggler != "abort" or config.mode == "naive":
        assert not policy_aborts
