"""Sandbox slots as an input of the pure scheduler: a fixed number, or the cluster's.

Owns :class:`SandboxSlots`, mixed into :class:`~rollbank.scheduling.scheduler.Scheduler`.
With the local backend the slots are ``scheduler.sandbox_slots``; with a cluster (the Ray
backend) the driver reports every change of the live nodes' slots with
:meth:`SandboxSlots.on_capacity`: an input event like any other, applied at the next poll.

Invariants
- Capacity only gates launches: when it falls, no running attempt is aborted for it (the
  attempts of a lost node end by themselves as infra failures and are re-run).
- Each change is recorded as a ``capacity`` event; 0 is allowed (no node left: nothing
  launches until one joins).
"""

from __future__ import annotations

from rollbank.clock import Clock
from rollbank.scheduling.config import SchedulerConfig
from rollbank.scheduling.events import CapacityChanged, Event, EventKind


class SandboxSlots:
    config: SchedulerConfig
    clock: Clock
    outbox: list[Event]

    @property
    def sandbox_slots(self) -> int:
        """Attempts that may hold a sandbox at once, now."""
        return self.config.sandbox_slots

    def on_capacity(self, sandbox_slots: int) -> None:
        """The sandbox capacity is now ``sandbox_slots`` (nodes joined or left)."""
        slots = max(0, int(sandbox_slots))
        if slots == self.config.sandbox_slots:
            return
        # model_copy does not validate: 0 slots (no node left) is a legal state here
        self.config = self.config.model_copy(update={"sandbox_slots": slots})
        self.outbox.append(CapacityChanged(kind=EventKind.CAPACITY, t=self.clock.now(),
                                           sandbox_slots=slots))
