"""Sandbox slots: the scheduler's first capacity, a fixed number or a cluster's live slots.

Owns :class:`SandboxSlots` (a :class:`~.capacities.SandboxCapacity`). With the local backend
the slots are ``scheduler.sandbox_slots`` from the config; with a cluster (the Ray backend)
the driver reports every change of the live nodes' slots to
:meth:`~rollbank.scheduling.policy.scheduler.Scheduler.on_capacity`, which resizes this
component: an input event like any other, applied at the next poll.

Invariants
- Capacity only gates launches: when it falls, no running attempt is aborted for it (the
  attempts of a lost node end by themselves as infra failures and are re-run).
- 0 is allowed (no node left: nothing launches until one joins).
"""

from __future__ import annotations


class SandboxSlots:
    """How many attempts may hold a sandbox at once."""

    def __init__(self, slots: int) -> None:
        self._slots = max(0, int(slots))

    @property
    def slots(self) -> int:
        return self._slots

    def resize(self, slots: int) -> bool:
        new = max(0, int(slots))
        if new == self._slots:
            return False
        self._slots = new
        return True
