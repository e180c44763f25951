"""Closing a batch window (pure): the events and the :class:`Batch` for the groups the ready
bank handed over. Every attempt still owned by the window is announced as carried, the
ledger's window is closed into the batch's accounting, and the batch carries its selection
profile and version lag. Used by :class:`~rollbank.scheduling.policy.scheduler.Scheduler` when a batch
is due."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rollbank.batching.batch import Batch, GroupResult, Unreachable
from rollbank.batching.stats import max_version, version_lag_histogram
from rollbank.scheduling.config import SchedulerConfig
from rollbank.scheduling.policy.events import AttemptCarried, BatchEvent, Event, EventKind
from rollbank.scheduling.policy.ledger import AttemptState
from rollbank.scheduling.policy.profile import selection_profile
from rollbank.scheduling.policy.ready_bank import ReadyBank
from rollbank.scheduling.policy.types import AttemptKey


def close_window(bank: ReadyBank, groups: Sequence[GroupResult], *, index: int,
                 window_start: float, now: float, config: SchedulerConfig,
                 unreachable: Sequence[Unreachable],
                 ids: Callable[[AttemptKey], dict[str, Any]],
                 record: bool = True) -> tuple[Batch, list[Event]]:
    """The batch of ``groups`` (already taken from ``bank``) and the events that go with it:
    one ``carried`` per attempt the window leaves unsettled, then ``batch_ready``; no events
    are built when not ``record`` (long simulations)."""
    accepted = bank.consumed_entries([g.group_id for g in groups])
    ledger = bank.ledger
    profile = selection_profile(groups, accepted, ledger.pool, ledger.in_flight(), now)
    events: list[Event] = [
        AttemptCarried(kind=EventKind.CARRIED, t=now, **ids(e.key), batch_index=index,
                       running=e.state is AttemptState.IN_FLIGHT)
        for e in (ledger.unsettled() if record else ())
        if e.state is not AttemptState.DELIVERED  # delivered: in a batch, not carried
    ]
    accounting = ledger.close_window(now)
    trajs = [t for g in groups for t in g.trajectories]
    version = max_version(trajs)
    batch = Batch(
        index=index, groups=tuple(groups), accounting=accounting, profile=profile,
        window_start=window_start, ready_at=now,
        complete=len(groups) == config.groups_per_batch,
        meta={"policy_version": version, "version_lag": version_lag_histogram(trajs, version),
              "mode": config.mode.value, "straggler": config.straggler.value,
              # every complete group so far, not only this batch's (dynamic sampling holds some)
              "groups": {"dynamic_sampling": bank.hold.enabled, **bank.hold.counts.to_dict()}},
        unreachable=tuple(unreachable),
    )
    if not record:
        return batch, events
    events.append(BatchEvent(
        kind=EventKind.BATCH_READY, t=now, batch_index=index, groups=len(groups),
        trajectories=len(trajs), window_start=window_start,
        accounting={k: v for k, v in accounting.to_dict().items() if isinstance(v, int)},
        delivered=tuple(e.key.attempt_id for e in accepted),
    ))
    return batch, events
