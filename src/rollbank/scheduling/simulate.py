"""Virtual-time simulation: the real scheduler policy over a scripted workload, no I/O.

A discrete-event loop drives :class:`~rollbank.scheduling.scheduler.Scheduler` with a
:class:`~rollbank.clock.FakeClock`: each launched attempt finishes after the duration the
workload gives it (aborts remove it), so straggler policies and over-provisioning can be
compared in milliseconds on identical workloads. Only sandbox slots are modelled (an attempt
holds one for its whole duration); inference contention is folded into the durations.

Invariant: the simulation ends with the scheduler closed, so every launched attempt is
settled (``consumed``, ``retried`` or ``waste``) when :func:`simulate` returns.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollbank.batching.batch import Batch, Unreachable
from rollbank.clock import FakeClock
from rollbank.episodes.outcome import Reason
from rollbank.scheduling.config import SchedulerConfig
from rollbank.scheduling.events import Event
from rollbank.scheduling.fake import FakePlan, make_trajectory
from rollbank.scheduling.ledger import AttemptState
from rollbank.scheduling.scheduler import Scheduler
from rollbank.scheduling.types import Abort, AttemptKey, AttemptSpec, EmitBatch, Launch


@dataclass(frozen=True)
class SimEpisode:
    """What the workload says about one attempt."""

    duration_s: float
    reason: Reason = Reason.VERIFIED_PASS
    reward: float | None = 1.0


@dataclass(frozen=True)
class SimResult:
    batches: tuple[Batch, ...]
    unreachable: tuple[Unreachable, ...]  # tasks given up on at the re-queue cap
    end_s: float  # virtual time when the last batch was emitted
    launched: int
    consumed: int
    retried: int
    waste: int
    sandbox_busy_s: float  # slot-seconds held by attempts (consumed + retried + waste)

    @property
    def batch_times(self) -> list[float]:
        return [b.time_to_batch_s for b in self.batches]


def simulate(
    config: SchedulerConfig,
    task_ids: Sequence[str],
    workload: Callable[[AttemptSpec], SimEpisode],
    *,
    max_events: int = 1_000_000,
    events: list[Event] | None = None,
) -> SimResult:
    """Run ``config`` over ``workload`` in virtual time; lifecycle events go to ``events``."""
    sink: list[Event] = events if events is not None else []
    clock = FakeClock()
    sched = Scheduler(config, task_ids, clock)
    pending: list[tuple[float, AttemptKey]] = []
    live: dict[AttemptKey, tuple[AttemptSpec, SimEpisode]] = {}
    batches: list[Batch] = []
    for _ in range(max_events):
        for d in sched.poll():
            if isinstance(d, Launch):
                ep = workload(d.spec)
                live[d.spec.key] = (d.spec, ep)
                heapq.heappush(pending, (clock.now() + ep.duration_s, d.spec.key))
            elif isinstance(d, Abort):
                live.pop(d.key, None)
                sched.on_aborted(d.key)
            elif isinstance(d, EmitBatch):
                batches.append(d.batch)
                sched.ack(d.batch.index)  # the simulated consumer takes every batch at once
        sink += sched.drain_events()
        if sched.done or not pending:
            break
        t, key = heapq.heappop(pending)
        if key not in live:
            continue  # aborted earlier
        clock.set(t)
        spec, ep = live.pop(key)
        plan = FakePlan(ep.reason, ep.reward)
        sched.on_finished(key, make_trajectory(spec, plan, now=t))
    end = clock.now()
    sched.close()
    sink += sched.drain_events()
    ledger = sched.bank.ledger
    counts = ledger.counts()
    return SimResult(
        batches=tuple(batches),
        unreachable=tuple(sched.unreachable),
        end_s=batches[-1].ready_at if batches else end,
        launched=len(ledger.entries),
        consumed=counts[AttemptState.CONSUMED],
        retried=counts[AttemptState.RETRIED],
        waste=counts[AttemptState.WASTE],
        sandbox_busy_s=sum(e.held_s(end) for e in ledger.entries.values()),
    )
