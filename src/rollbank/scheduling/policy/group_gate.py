"""The seam of a gate on complete groups: a strategy the ready bank holds them for.

A :class:`GroupGate` is injected into the ready bank by the scheduler that owns both
(``Scheduler(..., gate=...)``); the driver learns of it from the scheduler alone
(:meth:`~rollbank.scheduling.policy.scheduler.Scheduler.drain_scoring`). Without a gate a
group completes when every sibling slot is terminal; with one:

1. the bank offers the gate the group's valid siblings (:meth:`GroupGate.hold`); a gate that
   holds it keeps the group ``open`` and queues a :class:`NeedsScoring` for the driver
   (:meth:`GroupGate.drain`);
2. the driver scores the siblings with the current policy (I/O, driver-side) and hands the
   :class:`~rollbank.scheduling.policy.scores.GroupScores` back through the scheduler to
   :meth:`GroupGate.on_scored`, which re-runs slots or completes the group through the
   bank's :class:`GatedBank` operations;
3. every batch the scheduler emits passes through :meth:`GroupGate.batch` (its columns).

The one gate today is the staleness gate, :class:`~rollbank.scheduling.policy.gating.StalenessGating`.
Pure: no I/O, time from the bank's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rollbank.batching.batch import Batch
from rollbank.clock import Clock
from rollbank.episodes.trajectory import Trajectory
from rollbank.scheduling.policy.bank_records import GroupDone, Retry
from rollbank.scheduling.policy.events import Event
from rollbank.scheduling.policy.scores import GroupScores
from rollbank.scheduling.policy.types import AttemptKey

Member = tuple[AttemptKey, Trajectory, int]  # a valid sibling, and its slot's staleness re-runs


@dataclass(frozen=True)
class NeedsScoring:
    """Score these valid siblings of ``group_id`` with the current policy, then report the
    result (:meth:`~rollbank.scheduling.policy.scheduler.Scheduler.on_scored`)."""

    group_id: str
    keys: tuple[AttemptKey, ...]
    trajectories: tuple[Trajectory, ...]
    stale_retries: tuple[int, ...]  # per member: staleness re-runs of its slot so far


class GatedBank(Protocol):
    """What a gate may ask of the bank that holds its groups."""

    @property
    def clock(self) -> Clock: ...

    @property
    def outbox(self) -> list[Event]: ...

    @property
    def recording(self) -> bool:
        """Are event objects built (False in long simulations)?"""
        ...

    def is_open(self, group_id: str) -> bool: ...

    def task_of(self, group_id: str) -> str: ...

    def rerun_stale(self, key: AttemptKey) -> Retry:
        """Settle ``key`` ``retried`` and re-run its slot (same seed, one more staleness re-run)."""
        ...

    def complete(self, group_id: str, excluded: frozenset[int] = frozenset()) -> GroupDone:
        """Complete the held group; ``excluded`` slots leave it as waste (``stale_final``)."""
        ...


class GroupGate(Protocol):
    def hold(self, group_id: str, members: Sequence[Member]) -> bool:
        """Every slot of ``group_id`` is terminal: True keeps it open until it is scored."""
        ...

    def forget(self, group_id: str) -> None:
        """``group_id`` left the bank (consumed, dropped or aborted)."""
        ...

    def drain(self) -> list[NeedsScoring]:
        """Groups held since the last call, to be scored."""
        ...

    @property
    def pending(self) -> int:
        """Groups waiting for their scores."""
        ...

    def on_scored(self, bank: GatedBank, group_id: str,
                  scores: GroupScores) -> list[Retry] | GroupDone | None:
        """Judge a held group: the re-runs, or its completion; None: it no longer waits."""
        ...

    def batch(self, batch: Batch) -> Batch:
        """``batch`` as the consumer receives it (the gate's columns added)."""
        ...
