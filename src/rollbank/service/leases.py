"""Batch leases: which written batch the trainer gets next, and when it is done with it.

Pure state machine (no I/O; time from an injected :class:`~rollbank.clock.Clock`). A batch
is added once it is written (its directory is complete); then:

    ready --lease()--> leased --ack(lease_id)--> acked            (final: never handed out again)
      ^                  |
      +--- expiry -------+   (not acknowledged within ``lease_s``: offered again)
      +--- release(lease_id) (the trainer gives it back at once)

Choices
- At-least-once delivery, exactly-once acknowledgement: a trainer that crashes (or is slow)
  after a fetch does not lose the batch, it is offered again after ``lease_s``; a batch is
  acknowledged once and never offered after that.
- :meth:`BatchLeases.lease` hands out the lowest-indexed available batch (ready, or leased
  and expired), so batches go to the trainer in collection order, re-offers first.
- An acknowledgement carries the lease id it answers. It is accepted for the batch's latest
  lease, even past its expiry as long as nobody else leased the batch since (a late ack is
  still the only consumer's); an ack with an older lease id is refused (409), and a repeated
  ack of the same lease is answered ``already`` (HTTP retries are safe).
- Expiry is applied lazily, whenever the machine is asked (lease, ack, counts), so the
  result does not depend on when a driver happened to tick.
- A hand-out that reached nobody (the long poll's client disconnected before the answer) is
  undone by :meth:`BatchLeases.cancel`: the batch is ready again at once, as if the lease had
  never been granted (no redelivery, no expiry, the previous lease still acknowledgeable).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rollbank.clock import Clock
from rollbank.errors import ServiceError


class BatchState(enum.Enum):
    READY = "ready"
    LEASED = "leased"
    ACKED = "acked"


@dataclass(frozen=True)
class Lease:
    """One hand-out of a batch. ``delivery`` counts hand-outs of this batch (1 = first)."""

    batch_index: int
    lease_id: str
    path: str
    expires_at: float
    delivery: int


@dataclass
class _Entry:
    index: int
    path: str
    state: BatchState = BatchState.READY
    lease: Lease | None = None  # the latest lease (kept after expiry to accept a late ack)
    deliveries: int = 0
    previous: Lease | None = None  # the lease before the latest (restored by cancel)


class BatchLeases:
    """Written batches, their leases and acknowledgements (see the module doc)."""

    def __init__(self, clock: Clock, *, lease_s: float) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s must be > 0, got {lease_s}")
        self.clock = clock
        self.lease_s = lease_s
        self._entries: dict[int, _Entry] = {}
        self._issued = 0
        self.redeliveries = 0  # hand-outs after the first (expired or released leases)
        self.expired = 0
        self.released = 0

    # ------------------------------------------------------------ transitions
    def add(self, index: int, path: str) -> None:
        """A batch is written and complete: it can be leased."""
        if index in self._entries:
            raise ValueError(f"batch {index} was already added")
        self._entries[index] = _Entry(index, path)

    def lease(self) -> Lease | None:
        """Lease the lowest-indexed available batch, or None if there is none."""
        self._expire()
        ready = [e for e in self._entries.values() if e.state is BatchState.READY]
        if not ready:
            return None
        e = min(ready, key=lambda x: x.index)
        self._issued += 1
        e.deliveries += 1
        if e.deliveries > 1:
            self.redeliveries += 1
        e.state = BatchState.LEASED
        e.previous = e.lease
        e.lease = Lease(e.index, f"{e.index}-{e.deliveries}-{self._issued}", e.path,
                        self.clock.now() + self.lease_s, e.deliveries)
        return e.lease

    def ack(self, index: int, lease_id: str) -> bool:
        """Acknowledge batch ``index`` under ``lease_id``. True: acknowledged now; False: it
        already was (same lease). :class:`ServiceError` 404 unknown batch, 409 stale lease."""
        e = self._checked(index, lease_id)
        if e.state is BatchState.ACKED:
            return False
        e.state = BatchState.ACKED
        return True

    def release(self, index: int, lease_id: str) -> None:
        """The trainer gives the batch back: offered again at once."""
        e = self._checked(index, lease_id)
        if e.state is BatchState.ACKED:
            raise ServiceError(f"batch {index} is already acknowledged", status=409)
        if e.state is BatchState.LEASED:
            self.released += 1
        e.state = BatchState.READY
        e.lease = None

    def cancel(self, index: int, lease_id: str) -> None:
        """Undo the hand-out ``lease_id`` that reached nobody: the batch is ready again at
        once and the hand-out is not counted (no-op if it is no longer the running lease)."""
        e = self._entries.get(index)
        if e is None or e.lease is None or e.lease.lease_id != lease_id \
                or e.state is not BatchState.LEASED:
            return
        if e.deliveries > 1:
            self.redeliveries -= 1
        e.deliveries -= 1
        e.state = BatchState.READY
        e.lease, e.previous = e.previous, None

    def _checked(self, index: int, lease_id: str) -> _Entry:
        self._expire()
        e = self._entries.get(index)
        if e is None:
            raise ServiceError(f"batch {index} has not been written", status=404)
        if e.lease is None or e.lease.lease_id != lease_id:
            latest = "none" if e.lease is None else e.lease.lease_id
            raise ServiceError(f"batch {index}: lease {lease_id!r} is not its latest lease "
                               f"({latest}); the batch was offered again", status=409)
        return e

    def _expire(self) -> None:
        now = self.clock.now()
        for e in self._entries.values():
            if e.state is BatchState.LEASED and e.lease is not None and e.lease.expires_at <= now:
                e.state = BatchState.READY  # e.lease kept: a late ack of it is still accepted
                self.expired += 1

    # ------------------------------------------------------------ queries
    def next_expiry(self) -> float | None:
        """When the earliest running lease expires (clock time), None if none runs."""
        times = [e.lease.expires_at for e in self._entries.values()
                 if e.state is BatchState.LEASED and e.lease is not None]
        return min(times) if times else None

    def state_of(self, index: int) -> BatchState | None:
        self._expire()
        e = self._entries.get(index)
        return None if e is None else e.state

    def counts(self) -> dict[str, int]:
        """written, ready (waiting for a fetch), leased (in flight), acked, unacked
        (written - acked), redeliveries, expired, released."""
        self._expire()
        by = {s: 0 for s in BatchState}
        for e in self._entries.values():
            by[e.state] += 1
        return {"written": len(self._entries), "ready": by[BatchState.READY],
                "leased": by[BatchState.LEASED], "acked": by[BatchState.ACKED],
                "unacked": len(self._entries) - by[BatchState.ACKED],
                "redeliveries": self.redeliveries, "expired": self.expired,
                "released": self.released}

    def unacknowledged(self) -> list[int]:
        """Indices of written batches not acknowledged yet, lowest first."""
        return sorted(e.index for e in self._entries.values() if e.state is not BatchState.ACKED)

    @property
    def unacked(self) -> int:
        return sum(1 for e in self._entries.values() if e.state is not BatchState.ACKED)

    @property
    def all_acked(self) -> bool:
        return all(e.state is BatchState.ACKED for e in self._entries.values())
