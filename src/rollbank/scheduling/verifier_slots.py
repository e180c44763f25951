"""Verifier slots: the scheduler's third capacity (a mixin of the Scheduler).

Verifiers are CPU-bound test suites; at most ``verifier_slots`` run at once (None: no limit).
Waiters are granted by group completion: the group with the fewest siblings still running
their episode (neither terminal nor at the verifier — waiting, verifying, or verified and not
yet returned) verifies first, since its verdicts complete it soonest; ties go to
``(seq, slot, retry)`` (older groups first); ``naive`` mode serves first come first served.
A waiter's rank follows its group: when a sibling reaches the verifier, returns or is
aborted, the group's waiters are re-ranked (stale heap entries are skipped when popped).
Pure bookkeeping: the driver turns grants into awakened futures.

Extras: :meth:`VerifierSlots.extras_contended` is the scheduler's gate for extra groups
(``hold_extras_when_contended``): an inference wait, or a verifier wait unless
``hold_extras_for_verifier`` is off.

Invariant: granted verifier slots never exceed the limit; a key waits at most once.
"""

from __future__ import annotations

import heapq

from rollbank.scheduling.types import AttemptKey

Rank = tuple[int, ...]


class VerifierSlots:
    """Verifier slot accounting, mixed into the scheduler (which supplies ``_remaining``)."""

    _ver_slots: int | None
    _ver_busy: set[AttemptKey]
    _ver_wait: list[tuple[Rank, AttemptKey]]
    _ver_rank: dict[AttemptKey, Rank]  # current rank of each waiter
    _ver_by_group: dict[str, set[AttemptKey]]  # group id -> its waiters
    _ver_past: dict[str, set[AttemptKey]]  # group id -> attempts at or past the verifier
    _ver_arrivals: int
    _ver_holds_extras: bool  # does a verifier wait hold extra groups back (config)

    @property
    def naive(self) -> bool:
        raise NotImplementedError

    def _remaining(self, group_id: str) -> int:
        """Sibling slots of ``group_id`` not yet terminal (supplied by the scheduler)."""
        raise NotImplementedError

    def inference_contended(self) -> bool:
        """Does a generate call wait for an inference slot? (supplied by the scheduler)"""
        raise NotImplementedError

    def _init_verifier_slots(self, slots: int | None, *, holds_extras: bool = True) -> None:
        self._ver_slots = slots
        self._ver_holds_extras = holds_extras
        self._ver_busy = set()
        self._ver_wait = []
        self._ver_rank = {}
        self._ver_by_group = {}
        self._ver_past = {}
        self._ver_arrivals = 0

    def _still_running(self, group_id: str) -> int:
        """Siblings of ``group_id`` neither terminal nor at the verifier."""
        return self._remaining(group_id) - len(self._ver_past.get(group_id, ()))

    def _ver_rank_of(self, key: AttemptKey, arrival: int) -> Rank:
        if self.naive:
            return (arrival,)
        return (self._still_running(key.group_id), key.seq, key.slot, key.retry, arrival)

    def request_verifier(self, key: AttemptKey) -> bool:
        """True: granted now. False: queued; a later :meth:`release_verifier` grants it."""
        if self._ver_slots is not None and not self.naive:
            past = self._ver_past.setdefault(key.group_id, set())
            if key not in past:
                past.add(key)
                self._rerank_verifier_waiters(key.group_id)
        if self._ver_slots is None or (len(self._ver_busy) < self._ver_slots
                                       and not self._ver_rank):
            self._ver_busy.add(key)
            return True
        self._ver_arrivals += 1
        rank = self._ver_rank_of(key, self._ver_arrivals)
        self._ver_rank[key] = rank
        self._ver_by_group.setdefault(key.group_id, set()).add(key)
        heapq.heappush(self._ver_wait, (rank, key))
        return False

    def release_verifier(self, key: AttemptKey) -> list[AttemptKey]:
        """Free ``key``'s verifier slot; return the waiters granted in its place."""
        self._ver_busy.discard(key)
        granted = []
        limit = self._ver_slots if self._ver_slots is not None else 0
        while self._ver_wait and len(self._ver_busy) < limit:
            rank, k = heapq.heappop(self._ver_wait)
            if self._ver_rank.get(k) != rank:
                continue  # re-ranked or cancelled: a stale entry
            self._forget_waiter(k)
            self._ver_busy.add(k)
            granted.append(k)
        return granted

    def cancel_verifier_wait(self, key: AttemptKey) -> None:
        if key in self._ver_rank:
            self._forget_waiter(key)  # its heap entry is now stale

    def _attempt_returned(self, key: AttemptKey) -> None:
        """``key`` returned or was aborted: it is no longer at the verifier; re-rank."""
        if not self._ver_past and not self._ver_by_group:
            return  # nobody at or waiting for a verifier (always so without a slot limit)
        past = self._ver_past.get(key.group_id)
        if past is not None:
            past.discard(key)
            if not past:
                del self._ver_past[key.group_id]
        self._rerank_verifier_waiters(key.group_id)

    def _rerank_verifier_waiters(self, group_id: str) -> None:
        waiting = self._ver_by_group.get(group_id)
        if not waiting or self.naive:
            return
        for k in waiting:
            rank = (self._still_running(group_id), *self._ver_rank[k][1:])
            if rank != self._ver_rank[k]:
                self._ver_rank[k] = rank
                heapq.heappush(self._ver_wait, (rank, k))

    def _forget_waiter(self, key: AttemptKey) -> None:
        del self._ver_rank[key]
        group = self._ver_by_group[key.group_id]
        group.discard(key)
        if not group:
            del self._ver_by_group[key.group_id]

    def verifiers_in_use(self) -> int:
        return len(self._ver_busy)

    def verifier_contended(self) -> bool:
        """Does any finished episode wait for a verifier slot?"""
        return bool(self._ver_rank)

    def extras_contended(self) -> bool:
        """Is a contended capacity holding extra groups back? An inference-slot wait always
        counts; a verifier-slot wait only with ``hold_extras_for_verifier`` (config)."""
        return self.inference_contended() or (self._ver_holds_extras and bool(self._ver_rank))
