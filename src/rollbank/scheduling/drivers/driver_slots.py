"""The slots the collection driver lends attempts (a component of the driver, by role).

Owns :class:`_Context` (the :class:`~rollbank.scheduling.policy.types.AttemptContext` one attempt
gets) and :class:`SlotLending`, which turns the scheduler's inference and verifier slot
decisions (``scheduler.slots``, :class:`~rollbank.scheduling.policy.capacities.Slots`) into
awaited futures: a request the scheduler does not grant at once waits on a future that
:meth:`SlotLending._grant` resolves when a release grants it; a cancelled waiter either gives
its slot back (granted just before the cancel) or leaves the scheduler's queue. When extras
were held back for contention and a release ends it
(:meth:`~rollbank.scheduling.policy.capacities.Slots.extras_contended`), the driver's loop is
nudged to poll again. The driver gives the component its scheduler and two callbacks: flush
the scheduler's events to the sink, and nudge the loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.types import AttemptKey

_VERIFIER = "\x00verifier"  # the grant key of a verifier slot (no server has this name)


class _Context:
    """The :class:`~rollbank.scheduling.policy.types.AttemptContext` the driver lends one attempt."""

    def __init__(self, lending: SlotLending, key: AttemptKey) -> None:
        self._lending = lending
        self._key = key

    def mark_started(self) -> None:
        self._lending.started(self._key)

    def inference_slot(self, server: str = "") -> AbstractAsyncContextManager[None]:
        return self._lending.inference_slot(self._key, server)

    def verifier_slot(self) -> AbstractAsyncContextManager[None]:
        return self._lending.verifier_slot(self._key)


class SlotLending:
    """Lending scheduler-owned slots to attempts, for the collection driver."""

    def __init__(self, scheduler: Scheduler, *, flush_events: Callable[[], None],
                 nudge: Callable[[], None]) -> None:
        self.scheduler = scheduler
        self._flush_events = flush_events
        self._nudge = nudge
        self._grants: dict[tuple[AttemptKey, str], asyncio.Future[None]] = {}

    def context(self, key: AttemptKey) -> _Context:
        """The context the attempt ``key`` runs with."""
        return _Context(self, key)

    def started(self, key: AttemptKey) -> None:
        self.scheduler.on_started(key)
        self._flush_events()

    def inference_slot(self, key: AttemptKey, server: str) -> AbstractAsyncContextManager[None]:
        s = self.scheduler.slots
        return self._slot(key, server, lambda: s.request_inference(key, server),
                          lambda: s.cancel_inference_wait(key, server),
                          lambda: self._release(key, server))

    def verifier_slot(self, key: AttemptKey) -> AbstractAsyncContextManager[None]:
        s = self.scheduler.slots
        return self._slot(key, _VERIFIER, lambda: s.request_verifier(key),
                          lambda: s.cancel_verifier_wait(key), lambda: self._release_verifier(key))

    @asynccontextmanager
    async def _slot(self, key: AttemptKey, tag: str, request: Callable[[], bool],
                    cancel_wait: Callable[[], None],
                    release: Callable[[], None]) -> AsyncIterator[None]:
        """Hold one scheduler-owned slot (``tag``: a server, or the verifier) while inside."""
        if not request():
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._grants[(key, tag)] = fut
            try:
                await fut
            except asyncio.CancelledError:
                self._grants.pop((key, tag), None)
                if fut.done() and not fut.cancelled():  # granted just before cancel
                    release()
                else:
                    cancel_wait()
                raise
        try:
            yield
        finally:
            release()

    def _release(self, key: AttemptKey, server: str) -> None:
        self._grant(self.scheduler.slots.release_inference(key, server), server)

    def _release_verifier(self, key: AttemptKey) -> None:
        self._grant(self.scheduler.slots.release_verifier(key), _VERIFIER)

    def _grant(self, granted: Iterable[AttemptKey], tag: str) -> None:
        """Wake the waiters the scheduler granted a released ``tag`` slot to."""
        for key in granted:
            fut = self._grants.pop((key, tag), None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        s = self.scheduler
        if s.holding_extras and not s.slots.extras_contended():
            self._nudge()

    def cancel(self, key: AttemptKey) -> None:
        """``key`` was aborted: its waits end (cancelled futures, left queues)."""
        slots = self.scheduler.slots
        for gk in [gk for gk in self._grants if gk[0] == key]:
            fut = self._grants.pop(gk)
            if not fut.done():
                fut.cancel()
            if gk[1] == _VERIFIER:
                slots.cancel_verifier_wait(key)
            else:
                slots.cancel_inference_wait(key, gk[1])
