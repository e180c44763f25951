"""What one attempt is: its identity (:class:`AttemptKey`) and what a runner receives
(:class:`AttemptSpec` with the :class:`AttemptContext` its driver lends it).

Invariants
- An attempt is identified by ``(group_id, slot, retry)``; ``attempt_id`` is unique per run.
- A group's ``seq`` is its original launch order and never changes: retries of a slot and
  carried work keep the ``seq`` of their group, which is their priority (lower runs first).

These nouns live in ``episodes`` (the runner's layer) so that the runner does not import the
scheduler above it; ``rollbank.scheduling.policy.types`` re-exports them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol


class AttemptKey(NamedTuple):
    """Identity of one attempt. Ordering is the scheduling priority: (seq, slot, retry, group_id).

    A named tuple (immutable, hashed and ordered in C: the scheduler's heaps and dicts hold
    one per attempt)."""

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
    - :meth:`verifier_slot` around every verifier run (and re-verify): it waits for one of
      the scheduler's verifier slots; when contended, the group closest to complete goes first.
    """

    def mark_started(self) -> None: ...

    def inference_slot(self, server: str = "") -> AbstractAsyncContextManager[None]: ...

    def verifier_slot(self) -> AbstractAsyncContextManager[None]: ...


class NullAttemptContext:
    """A context that does nothing: for runners used outside a driver (tests, replay)."""

    def mark_started(self) -> None:
        return None

    @asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        yield

    def inference_slot(self, server: str = "") -> AbstractAsyncContextManager[None]:
        return self._slot()

    def verifier_slot(self) -> AbstractAsyncContextManager[None]:
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
