"""The asyncio driver around :class:`~rollbank.service.leases.BatchLeases`: what the HTTP
routes call, and what the collection calls when a batch is written.

- :meth:`CollectorHub.on_batch` (the collector's ``on_batch`` hook, after the batch
  directory is written) adds the batch and wakes long polls; then it waits while
  ``max_unacked_batches`` written batches are unacknowledged (back-pressure: the collector
  does not hand over more than the trainer keeps up with).
- :meth:`CollectorHub.next_batch` long-polls: a lease at once if a batch is available,
  else it waits for a new batch, an expiring lease or the end of the collection.
- :meth:`CollectorHub.announce` applies a weight version through the ``apply`` hook the
  service installs once the inference plane is open (hot-load a checkpoint on every engine
  and tell the router; :mod:`rollbank.service.run`), one announcement at a time.

Nothing here blocks the event loop; state changes happen under one ``asyncio.Condition``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prometheus_client import CollectorRegistry, Gauge

from rollbank.clock import Clock
from rollbank.errors import ServiceError, rollbank_error_in
from rollbank.service.leases import BatchLeases, Lease

State = Literal["starting", "collecting", "finished", "failed", "stopping"]
#: The largest weight version: the batch schema's ``policy_versions`` column is int32.
MAX_WEIGHT_VERSION = 2**31 - 1
#: apply(version, checkpoint) -> details of the publication (JSON-able)
ApplyVersion = Callable[[int, str | None, bool], Awaitable[dict[str, Any]]]  # version, path, lora


class Finished:
    """No batch will come any more: the collection ended and every batch is acknowledged."""

    def __init__(self, state: State, error: str | None) -> None:
        self.state = state
        self.error = error


@dataclass(frozen=True)
class VersionRecord:
    version: int
    checkpoint: str | None  # the full-weights directory, or the adapter's when ``lora``
    applied: bool  # True: the service hot-loaded ``checkpoint``; False: the engines already serve it
    detail: dict[str, Any]
    announced_s: float  # since the service started
    lora: bool = False
    corrected_from: int | None = None  # a correction: the (wrong) version it replaced


class CollectorHub:
    """Batches written by the collection, leased to the trainer; versions; status."""

    def __init__(self, leases: BatchLeases, *, run_id: str, max_unacked: int, clock: Clock,
                 registry: CollectorRegistry | None = None, exit_when_done: bool = True) -> None:
        self.leases = leases
        self.exit_when_done = exit_when_done
        self.run_id = run_id
        self.max_unacked = max_unacked
        self.clock = clock
        self.state: State = "starting"
        self.error: str | None = None
        self.version = 0
        self.versions: list[VersionRecord] = []
        self.output: str | None = None
        self._apply: ApplyVersion | None = None
        self._changed = asyncio.Condition()
        self._announcing = asyncio.Lock()
        self._t0 = clock.now()
        self._gauges = _Gauges(registry) if registry is not None else None

    # ------------------------------------------------------------ collection side
    def collecting(self, apply: ApplyVersion, output: str) -> None:
        """The planes are open and the collection starts; ``apply`` applies versions."""
        self._apply = apply
        self.output = output
        self.state = "collecting"

    async def on_batch(self, index: int, path: Path) -> None:
        async with self._changed:
            self.leases.add(index, str(path))
            self.refresh_gauges()
            self._changed.notify_all()
            await self._changed.wait_for(lambda: self.leases.unacked < self.max_unacked)

    async def finish(self, error: BaseException | None = None) -> None:
        """The collection ended (``error``: it failed); wakes every waiter."""
        async with self._changed:
            if error is not None:
                cause = rollbank_error_in(error) or error
                self.state, self.error = "failed", f"{type(cause).__name__}: {cause}"
            elif self.state != "stopping":
                self.state = "finished"
            self._changed.notify_all()

    async def stop(self) -> None:
        """The service is shutting down: long polls return (the collection is cancelled)."""
        async with self._changed:
            if not (self.state == "finished" and self.leases.all_acked):  # else: a clean end
                self.state = "stopping"
            self._changed.notify_all()

    async def wait_all_acked(self) -> None:
        """Return once every written batch is acknowledged."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.leases.all_acked)

    @property
    def done(self) -> bool:
        """Nothing will be handed out any more (ended, and every batch acknowledged)."""
        ended = self.state in ("finished", "failed", "stopping")
        return ended and (self.state != "finished" or self.leases.all_acked)

    # ------------------------------------------------------------ trainer side
    async def next_batch(self, timeout_s: float) -> Lease | Finished | None:
        """A lease, :class:`Finished`, or None when ``timeout_s`` passed with nothing to hand out."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        async with self._changed:
            while True:
                if self.state == "stopping":
                    return Finished(self.state, self.error)
                lease = self.leases.lease()
                if lease is not None:
                    self.refresh_gauges()
                    return lease
                if self.done:
                    return Finished(self.state, self.error)
                wait = deadline - loop.time()
                if wait <= 0:
                    return None
                expiry = self.leases.next_expiry()
                if expiry is not None:  # wake when a lease runs out: its batch is offered again
                    wait = min(wait, max(expiry - self.clock.now(), 0.0) + 0.01)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), wait)

    async def ack(self, index: int, lease_id: str) -> bool:
        async with self._changed:
            fresh = self.leases.ack(index, lease_id)
            self.refresh_gauges()
            self._changed.notify_all()  # back-pressure may let go; done may become true
            return fresh

    async def cancel(self, index: int, lease_id: str) -> None:
        """The hand-out reached nobody (the client disconnected): ready again at once."""
        async with self._changed:
            self.leases.cancel(index, lease_id)
            self.refresh_gauges()
            self._changed.notify_all()

    async def release(self, index: int, lease_id: str) -> None:
        async with self._changed:
            self.leases.release(index, lease_id)
            self.refresh_gauges()
            self._changed.notify_all()

    async def announce(self, version: int, checkpoint: str | None, *,
                       lora: bool = False, correct: bool = False) -> VersionRecord:
        """Apply ``version``: 422 outside 1..:data:`MAX_WEIGHT_VERSION`, 409 if not newer than
        the current one (unless ``correct``: it replaces a wrongly announced current version),
        503 before the planes are open or after the collection ended."""
        if not 1 <= version <= MAX_WEIGHT_VERSION:
            raise ServiceError(f"version {version} is outside 1..{MAX_WEIGHT_VERSION} (the "
                               "batches' policy_versions column is int32)", status=422)
        async with self._announcing:
            if version <= self.version and not correct:
                raise ServiceError(f"version {version} is not newer than the current version "
                                   f"{self.version} (announce with \"correct\": true to replace "
                                   "a wrongly announced version)", status=409)
            if self._apply is None or self.state != "collecting":
                raise ServiceError(f"the collection is {self.state}: no engine to apply "
                                   f"version {version} to", status=503)
            detail = await self._apply(version, checkpoint, lora)
            rec = VersionRecord(version, checkpoint, checkpoint is not None, detail,
                                self.clock.now() - self._t0, lora,
                                self.version if correct else None)
            self.version = version
            self.versions.append(rec)
            self.refresh_gauges()
            return rec

    def status(self) -> dict[str, Any]:
        c = self.leases.counts()
        return {"run_id": self.run_id, "state": self.state, "error": self.error,
                "output": self.output, "version": self.version,
                "batches": c, "in_flight": c["leased"], "ends": self.ends(),
                "uptime_s": self.clock.now() - self._t0, "wall_clock": time.time()}

    def ends(self) -> str:
        """When the service will exit, in words (status ``ends``)."""
        if self.state in ("starting", "collecting"):
            return "after the collection ends (or on SIGINT/SIGTERM)"
        if self.state != "finished":
            return f"now: the collection is {self.state}"
        if not self.exit_when_done:
            return ("keeps serving until SIGINT/SIGTERM (service.exit_when_done = false)")
        pending = self.leases.unacknowledged()
        if not pending:
            return "now: every batch is acknowledged"
        return (f"once batch(es) {', '.join(map(str, pending))} are acknowledged "
                "(or on SIGINT/SIGTERM)")

    def refresh_gauges(self) -> None:
        if self._gauges is not None:
            self._gauges.set(self.leases.counts(), self.version)


class _Gauges:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.batches = Gauge("rollbank_service_batches", "written batches by lease state "
                             "(written, ready, leased, acked, unacked, redeliveries, expired, released)",
                             ["state"], registry=registry)
        self.version = Gauge("rollbank_service_weight_version",
                             "the latest weight version announced to the service", registry=registry)

    def set(self, counts: dict[str, int], version: int) -> None:
        for k, v in counts.items():
            self.batches.labels(k).set(v)
        self.version.set(version)
