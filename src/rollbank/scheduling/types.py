"""Nouns shared by the scheduler, the ready bank and the driver.

Owns the identity of an attempt (:class:`AttemptKey`), what a runner receives
(:class:`AttemptSpec` with its :class:`AttemptContext`), and the scheduler's decisions as data
(:class:`Launch`, :class:`Abort`, :class:`EmitBatch`).

Invariants
- An attempt is identified by ``(group_id, slot, retry)``; ``attempt_id`` is unique per run.
- A group's ``seq`` is its original launch order and never changes: retries of a slot and
  carried work keep the ``seq`` of their group, which is their priority (lower runs first).
- Decisions are immutable values; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rollbank.scheduling.batch import Batch


class StragglerPolicy(StrEnum):
    """What happens to unfinished attempts once a batch has enough complete groups."""

    WAIT = "wait"  # the batch is emitted only when every group in the pool is terminal
    CARRY = "carry"  # emit now; unfinished attempts keep running and join the next batch
    ABORT = "abort"  # emit now; unfinished attempts are cancelled and reported as waste


class SchedulingMode(StrEnum):
    """``optimized``: ready bank, over-provisioning, priorities. ``naive``: the baseline.

    ``naive`` is a launch-order synchronous batch: exactly ``groups_per_batch`` groups are
    launched per batch (no over-provisioning), the batch waits for all of them, waiting
    attempts are served first-come-first-served (no sibling priority), an infra failure is not
    re-run (retry limit 0), and a dropped group is not replaced (the batch is smaller).
    """

    OPTIMIZED = "optimized"
    NAIVE = "naive"


@dataclass(frozen=True, order=True)
class AttemptKey:
    """Identity of one attempt. Ordering is the scheduling priority: (seq, slot, retry, group_id)."""

    seq: int  # original launch order of the group (priority; lower first)
    slot: int  # sibling slot within the group, 0..group_size-1
    retry: int  # 0 for the first run of the slot, k for its k-th re-run
    group_id: str  # last in the ordering: only a tie-break between re-queued groups

    @property
    def attempt_id(self) -> str:
        return f"{self.group_id}/s{self.slot}/r{self.retry}"


class AttemptContext(Protocol):
    """What the driver lends a runner for one attempt.

    - :meth:`mark_started` once the sandbox is ready (emits the ``started`` event).
    - :meth:`inference_slot` around every generate call: it waits for one of the per-server
      inference slots; when slots are contended, attempts of older groups are served first.
      ``server`` is the base URL the router chose ("" means one shared pool).
    """

    def mark_started(self) -> None: ...

    def inference_slot(self, server: str = "") -> AbstractAsyncContextManager[None]: ...


class NullAttemptContext:
    """A context that does nothing: for runners used outside a driver (tests, replay)."""

    def mark_started(self) -> None:
        return None

    @asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        yield

    def inference_slot(self, server: str = "") -> AbstractAsyncContextManager[None]:
        return self._slot()


NULL_CONTEXT = NullAttemptContext()


@dataclass(frozen=True)
class AttemptSpec:
    """Everything a runner needs to run one attempt (one episode in one sandbox).

    The runner must return a :class:`~rollbank.episodes.trajectory.Trajectory` whose
    ``trajectory_id == attempt_id``, ``group_id``, ``task_id``, ``attempt == slot`` and
    ``retry`` match this spec, and ``launched_at`` set to ``launched_at`` here. A failed
    episode is data: the runner records an ``EpisodeOutcome`` rather than raising.
    """

    key: AttemptKey
    task_id: str
    seed: int  # same (seq, slot) -> same seed in every arm; retries keep the seed
    group_size: int
    launched_at: float  # scheduler clock time of the launch decision
    ctx: AttemptContext = field(default=NULL_CONTEXT, compare=False, repr=False)

    @property
    def group_id(self) -> str:
        return self.key.group_id

    @property
    def slot(self) -> int:
        return self.key.slot

    @property
    def retry(self) -> int:
        return self.key.retry

    @property
    def attempt_id(self) -> str:
        return self.key.attempt_id


# ---------------------------------------------------------------- decisions (data)
@dataclass(frozen=True)
class Launch:
    """Start this attempt now (a sandbox slot has been reserved for it)."""

    spec: AttemptSpec


@dataclass(frozen=True)
class Abort:
    """Cancel this in-flight attempt (straggler policy ``abort`` or end of collection)."""

    key: AttemptKey
    why: str


@dataclass(frozen=True)
class EmitBatch:
    """A batch is ready; the driver hands ``batch`` to the trainer."""

    batch: Batch


Decision = Launch | Abort | EmitBatch
