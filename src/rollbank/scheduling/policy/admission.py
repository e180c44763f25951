"""Where the scheduler's next group comes from: the task sequence and the re-queue.

Owns :class:`GroupSource`, a component of :class:`~rollbank.scheduling.policy.scheduler.Scheduler`.
Group ``seq`` runs ``task_ids[seq % len(task_ids)]``; a new group takes the next ``seq``
(``g{seq:05d}``, at most ``max_groups``); a group the straggler policy aborted may come back
at its old place (:meth:`GroupSource.aborted`: re-queued if ``requeue_aborted``, at most
``max_requeues`` times, as ``g{seq:05d}-q{n}``), and re-queued groups open before new ones,
oldest ``seq`` first. At the cap the task is given up on: an
:class:`~rollbank.batching.batch.Unreachable` record with the longest time any of its aborted
attempts ran. Pure bookkeeping: no clock, no events.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from rollbank.batching.batch import Unreachable


class GroupSource:
    """The groups a scheduler may open: new ones from the task sequence, re-queued ones."""

    def __init__(self, task_ids: Sequence[str], *, max_groups: int | None,
                 requeue_aborted: bool, max_requeues: int | None) -> None:
        if not task_ids:
            raise ValueError("the scheduler needs at least one task id")
        self.task_ids = list(task_ids)
        self._max_groups = max_groups
        self._requeue_aborted = requeue_aborted
        self._max_requeues = max_requeues
        self.created = 0  # groups created from the task sequence (re-queues not counted)
        self._generation: dict[int, int] = {}  # seq -> times re-queued
        self._requeue: list[int] = []  # heap of seqs of aborted groups to run again
        self._longest_aborted: dict[int, float] = {}  # seq -> longest aborted attempt (s)
        self.unreachable: list[Unreachable] = []  # tasks given up on (re-queue cap reached)

    def can_create(self) -> bool:
        """May a new group be created from the task sequence?"""
        return self._max_groups is None or self.created < self._max_groups

    def has_next(self) -> bool:
        """Is a group left to open (re-queued, or new)?"""
        return bool(self._requeue) or self.can_create()

    def next(self, *, new_only: bool = False) -> tuple[str, str, int]:
        """The next group to open, re-queued ones first (``new_only``: only a new one), as
        ``(group_id, task_id, seq)``. Call only when :meth:`has_next` (or :meth:`can_create`)."""
        if self._requeue and not new_only:
            seq = heapq.heappop(self._requeue)
            self._generation[seq] = self._generation.get(seq, 0) + 1
            group_id = f"g{seq:05d}-q{self._generation[seq]}"
        else:
            seq = self.created
            self.created += 1
            group_id = f"g{seq:05d}"
        return group_id, self.task_ids[seq % len(self.task_ids)], seq

    def attempt_aborted(self, seq: int, elapsed_s: float) -> None:
        """An attempt of group ``seq`` was aborted after running ``elapsed_s``."""
        self._longest_aborted[seq] = max(self._longest_aborted.get(seq, 0.0), elapsed_s)

    def aborted(self, group_id: str, task_id: str, seq: int) -> Unreachable | None:
        """Group ``seq`` was aborted: re-queue it, or give its task up at the cap (returned)."""
        if not self._requeue_aborted:
            return None
        requeues = self._generation.get(seq, 0)
        if self._max_requeues is None or requeues < self._max_requeues:
            heapq.heappush(self._requeue, seq)
            return None
        u = Unreachable(task_id=task_id, group_id=group_id, seq=seq, requeues=requeues,
                        longest_elapsed_s=self._longest_aborted.pop(seq, 0.0))
        self.unreachable.append(u)
        return u
