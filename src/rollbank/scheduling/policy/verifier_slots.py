"""Verifier slots: the scheduler's third capacity (an owned component).

Verifiers are CPU-bound test suites; at most ``verifier_slots`` run at once (None: no limit).
Waiters are granted by group completion: the group with the fewest siblings still running
their episode (neither terminal nor at the verifier — waiting, verifying, or verified and not
yet returned) verifies first, since its verdicts complete it soonest; ties go to
``(seq, slot, retry)`` (older groups first); ``fifo`` (``naive`` mode) serves first come
first served. The group's progress is the ready bank's: the scheduler passes it in with each
call that ranks (``remaining``: a group's sibling slots not yet terminal).
A waiter's rank follows its group: when a sibling reaches the verifier, returns or is
aborted, the group's waiters are re-ranked (stale heap entries are skipped when popped).
Pure bookkeeping: the driver turns grants into awakened futures.

Extras: :attr:`VerifierSlots.holds_extras` (``hold_extras_for_verifier``) says whether a
verifier wait holds extra groups back; the scheduler decides
(:meth:`~rollbank.scheduling.policy.capacities.Slots.extras_contended`).

Invariant: granted verifier slots never exceed the limit; a key waits at most once.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from rollbank.scheduling.policy.types import AttemptKey

Rank = tuple[int, ...]
Remaining = Callable[[str], int]  # group id -> its sibling slots not yet terminal


class VerifierSlots:
    """Verifier slot accounting (a :class:`~.capacities.VerifierCapacity`)."""

    def __init__(self, slots: int | None, *, fifo: bool = False, holds_extras: bool = True) -> None:
        self._slots = slots
        self._fifo = fifo
        self._holds_extras = holds_extras
        self._busy: set[AttemptKey] = set()
        self._wait: list[tuple[Rank, AttemptKey]] = []
        self._rank: dict[AttemptKey, Rank] = {}  # current rank of each waiter
        self._by_group: dict[str, set[AttemptKey]] = {}  # group id -> its waiters
        self._past: dict[str, set[AttemptKey]] = {}  # group id -> attempts at or past the verifier
        self._arrivals = 0

    @property
    def holds_extras(self) -> bool:
        return self._holds_extras

    def _still_running(self, group_id: str, remaining: Remaining) -> int:
        """Siblings of ``group_id`` neither terminal nor at the verifier."""
        return remaining(group_id) - len(self._past.get(group_id, ()))

    def request(self, key: AttemptKey, remaining: Remaining) -> bool:
        """True: granted now. False: queued; a later :meth:`release` grants it."""
        if self._slots is not None and not self._fifo:
            past = self._past.setdefault(key.group_id, set())
            if key not in past:
                past.add(key)
                self._rerank(key.group_id, remaining)
        if self._slots is None or (len(self._busy) < self._slots and not self._rank):
            self._busy.add(key)
            return True
        self._arrivals += 1
        rank: Rank = ((self._arrivals,) if self._fifo else
                      (self._still_running(key.group_id, remaining), key.seq, key.slot,
                       key.retry, self._arrivals))
        self._rank[key] = rank
        self._by_group.setdefault(key.group_id, set()).add(key)
        heapq.heappush(self._wait, (rank, key))
        return False

    def release(self, key: AttemptKey) -> list[AttemptKey]:
        """Free ``key``'s verifier slot; return the waiters granted in its place."""
        self._busy.discard(key)
        granted = []
        limit = self._slots if self._slots is not None else 0
        while self._wait and len(self._busy) < limit:
            rank, k = heapq.heappop(self._wait)
            if self._rank.get(k) != rank:
                continue  # re-ranked or cancelled: a stale entry
            self._forget_waiter(k)
            self._busy.add(k)
            granted.append(k)
        return granted

    def cancel(self, key: AttemptKey) -> None:
        if key in self._rank:
            self._forget_waiter(key)  # its heap entry is now stale

    def returned(self, key: AttemptKey, remaining: Remaining) -> None:
        """``key`` returned or was aborted: it is no longer at the verifier; re-rank."""
        if not self._past and not self._by_group:
            return  # nobody at or waiting for a verifier (always so without a slot limit)
        past = self._past.get(key.group_id)
        if past is not None:
            past.discard(key)
            if not past:
                del self._past[key.group_id]
        self._rerank(key.group_id, remaining)

    def _rerank(self, group_id: str, remaining: Remaining) -> None:
        waiting = self._by_group.get(group_id)
        if not waiting or self._fifo:
            return
        for k in waiting:
            rank = (self._still_running(group_id, remaining), *self._rank[k][1:])
            if rank != self._rank[k]:
                self._rank[k] = rank
                heapq.heappush(self._wait, (rank, k))

    def _forget_waiter(self, key: AttemptKey) -> None:
        del self._rank[key]
        group = self._by_group[key.group_id]
        group.discard(key)
        if not group:
            del self._by_group[key.group_id]

    def in_use(self) -> int:
        return len(self._busy)

    def contended(self) -> bool:
        """Does any finished episode wait for a verifier slot?"""
        return bool(self._rank)
