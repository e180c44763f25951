"""The capacities an attempt waits for, as the scheduler's owned components: one Protocol each.

:class:`~rollbank.scheduling.policy.scheduler.Scheduler` owns one of each, passed in (or built
from its config by :func:`default_capacities`), and reaches them only through these methods:

- :class:`SandboxCapacity`: how many attempts may hold a sandbox now (a fixed number, or a
  cluster's live slots); implemented by :class:`~.sandbox_slots.SandboxSlots`.
- :class:`InferenceCapacity`: generate-call slots per server and the servers serving;
  implemented by :class:`~.inference_slots.InferenceSlots`.
- :class:`VerifierCapacity`: verifier slots, granted by group completion; implemented by
  :class:`~.verifier_slots.VerifierSlots`. Its rank needs the group's progress, which the
  scheduler's ready bank owns: it is passed in with each call (``remaining``), not shared.

Components are pure bookkeeping: no clock, no events, no I/O. The scheduler records the
``capacity`` / ``servers`` events when a component reports a change. :class:`Slots` is the
scheduler's desk for the slots the driver lends attempts (request, release, cancel of an
inference or a verifier slot) and decides what a contended capacity means for extra groups
(:meth:`Slots.extras_contended`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from rollbank.scheduling.config import SchedulerConfig, SchedulingMode
from rollbank.scheduling.policy.inference_slots import InferenceSlots
from rollbank.scheduling.policy.sandbox_slots import SandboxSlots
from rollbank.scheduling.policy.types import AttemptKey
from rollbank.scheduling.policy.verifier_slots import Remaining, VerifierSlots


class SandboxCapacity(Protocol):
    @property
    def slots(self) -> int:
        """Attempts that may hold a sandbox at once, now."""
        ...

    def resize(self, slots: int) -> bool:
        """The capacity is now ``slots`` (clamped at 0); True if it changed."""
        ...


class InferenceCapacity(Protocol):
    @property
    def servers(self) -> tuple[str, ...] | None:
        """The servers declared serving (None: not declared)."""
        ...

    @property
    def available(self) -> bool:
        """May an attempt launch as far as inference goes (a server serves, or none declared)?"""
        ...

    def set_servers(self, servers: Sequence[str]) -> bool:
        """The servers serving now; True if the set changed."""
        ...

    def request(self, key: AttemptKey, server: str) -> bool:
        """True: granted now. False: queued until a :meth:`release` grants it."""
        ...

    def release(self, key: AttemptKey, server: str) -> list[AttemptKey]:
        """Free ``key``'s slot on ``server``; the waiters granted in its place."""
        ...

    def cancel(self, key: AttemptKey, server: str) -> None:
        """``key`` stops waiting on ``server``."""
        ...

    def in_use(self, server: str) -> int: ...

    def contended(self) -> bool:
        """Does any generate call wait for a slot?"""
        ...


class VerifierCapacity(Protocol):
    @property
    def holds_extras(self) -> bool:
        """Does a verifier wait hold extra groups back (``hold_extras_for_verifier``)?"""
        ...

    def request(self, key: AttemptKey, remaining: Remaining) -> bool:
        """True: granted now. False: queued until a :meth:`release` grants it."""
        ...

    def release(self, key: AttemptKey) -> list[AttemptKey]:
        """Free ``key``'s slot; the waiters granted in its place."""
        ...

    def cancel(self, key: AttemptKey) -> None:
        """``key`` stops waiting."""
        ...

    def returned(self, key: AttemptKey, remaining: Remaining) -> None:
        """``key`` returned or was aborted: it is no longer at the verifier."""
        ...

    def in_use(self) -> int: ...

    def contended(self) -> bool:
        """Does any finished episode wait for a slot?"""
        ...


class Slots:
    """The inference and verifier slots as the driver lends them (``scheduler.slots``).

    ``progress`` is the ready bank's count of a group's sibling slots not yet terminal: the
    verifier's rank reads it at each request."""

    def __init__(self, inference: InferenceCapacity, verifier: VerifierCapacity,
                 progress: Remaining) -> None:
        self.inference = inference
        self.verifier = verifier
        self._progress = progress

    def request_inference(self, key: AttemptKey, server: str = "") -> bool:
        """True: granted now. False: queued; a later :meth:`release_inference` grants it."""
        return self.inference.request(key, server)

    def release_inference(self, key: AttemptKey, server: str = "") -> list[AttemptKey]:
        """Free ``key``'s slot on ``server``; return the waiters granted in its place."""
        return self.inference.release(key, server)

    def cancel_inference_wait(self, key: AttemptKey, server: str = "") -> None:
        self.inference.cancel(key, server)

    def request_verifier(self, key: AttemptKey) -> bool:
        """True: granted now. False: queued; a later :meth:`release_verifier` grants it."""
        return self.verifier.request(key, self._progress)

    def release_verifier(self, key: AttemptKey) -> list[AttemptKey]:
        """Free ``key``'s verifier slot; return the waiters granted in its place."""
        return self.verifier.release(key)

    def cancel_verifier_wait(self, key: AttemptKey) -> None:
        self.verifier.cancel(key)

    def returned(self, key: AttemptKey) -> None:
        """``key`` returned or was aborted: its group's verifier waiters are re-ranked."""
        self.verifier.returned(key, self._progress)

    def extras_contended(self) -> bool:
        """Is a contended capacity holding extra groups back? An inference-slot wait always
        counts; a verifier-slot wait only with ``hold_extras_for_verifier`` (config)."""
        return self.inference.contended() or (self.verifier.holds_extras
                                               and self.verifier.contended())


def default_capacities(config: SchedulerConfig) -> tuple[SandboxSlots, InferenceSlots,
                                                          VerifierSlots]:
    """The three capacities of ``config`` (already :meth:`~SchedulerConfig.effective`):
    ``naive`` mode serves waiters first come first served."""
    fifo = config.mode is SchedulingMode.NAIVE
    return (SandboxSlots(config.sandbox_slots),
            InferenceSlots(config.inference_slots_per_server, fifo=fifo),
            VerifierSlots(config.verifier_slots, fifo=fifo,
                          holds_extras=config.hold_extras_for_verifier))
