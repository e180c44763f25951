"""The ready bank's records: a group's status, its sibling slots, and the bank's decisions
(:class:`Retry`, :class:`GroupDone`). Plain data, owned and mutated by
:class:`~rollbank.scheduling.policy.ready_bank.ReadyBank` (and its gated subclass)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from rollbank.batching.batch import GroupResult
from rollbank.episodes.trajectory import Trajectory
from rollbank.scheduling.policy.types import AttemptKey


class GroupStatus(StrEnum):
    OPEN = "open"  # some slot not terminal
    READY = "ready"  # complete, in the bank
    DELIVERED = "delivered"  # handed out in a batch, awaiting the consumer's acknowledgement
    DROPPED = "dropped"
    ABORTED = "aborted"
    CONSUMED = "consumed"


@dataclass(frozen=True)
class Retry:
    """Re-run this slot: ``key`` is the new attempt (same group, slot and seed)."""

    key: AttemptKey
    task_id: str


@dataclass(frozen=True)
class GroupDone:
    """The group became complete: ``ready`` (in the bank) or dropped with ``why``."""

    group_id: str
    ready: bool
    why: str = ""


BankDecision = Retry | GroupDone | None


@dataclass(slots=True)
class SlotRecord:
    current: AttemptKey
    result: Trajectory | None = None
    retries: int = 0
    terminal: bool = False
    stale_retries: int = 0  # re-runs caused by the staleness gate (scheduling/policy/gating.py)


@dataclass(slots=True)
class GroupRecord:
    group_id: str
    task_id: str
    seq: int
    launched_at: float
    slots: list[SlotRecord]
    status: GroupStatus = GroupStatus.OPEN
    terminal: int = 0  # slots terminal so far
    attempts: list[AttemptKey] = field(default_factory=list)  # every launched key
    result: GroupResult | None = None
    valid_keys: list[AttemptKey] = field(default_factory=list)  # attempts in ``result``
    batch: int | None = None  # batch it was last delivered in
