"""The safe order over a fleet of separate servers, shared by the remote patterns.

close admission -> pause every server (in-flight plan) -> apply on every server (the
pattern's step: reload a checkpoint, or the weight-sync routes; the step names the version on
the engine) -> reset every prefix cache -> resume -> read back every engine's version -> reopen
admission (only if it was open before: an owner that closed it, e.g. the sync training loop
holding new tokens until a batch is trained on, reopens it itself). With the ``pause``
plan (requests frozen in place) the reset preempts the frozen requests, whose KV is then
recomputed with the new weights after the resume (``keep_kv=True`` keeps their old KV and
skips the reset instead: safe for new requests only when every request carries its version's
``cache_salt``, so none can hit a block of an older version). Each step starts only
when the previous one finished on all servers, so no server resumes before every server
holds the new weights.

Failure halfway: if the apply step fails on any server, every server is rolled back to the
previous weights (the pattern's rollback step, which names the previous version), then reset
and resumed; the versions the engines report afterwards go into the error's ``serving``.
Engines that cannot be reached (dead) are listed as ``lost``. Failures before the apply step
(pause) resume every server and touch no weights.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from rollbank.clock import Clock, MonotonicClock
from rollbank.errors import InferenceError, PublicationError
from rollbank.inference.protocol import AdmissionGate, PauseMode
from rollbank.inference.publishing.protocol import PLAN_TO_PAUSE, InflightPlan, PublicationRecord


class FleetClient(Protocol):
    """The control plane of one server that the fleet drives (VLLMClient has it)."""

    @property
    def base_url(self) -> str: ...

    def set_admission(self, gate: AdmissionGate) -> None: ...

    async def pause(self, mode: PauseMode = "wait", *, clear_cache: bool = True) -> None: ...

    async def resume(self) -> None: ...

    async def reset_prefix_cache(self, *, attempts: int = 20, reset_running_requests: bool = False) -> None: ...

    async def engine_version(self, request_id: str | None = None) -> int: ...


Step = Callable[[FleetClient], Awaitable[None]]


class Fleet:
    """Runs one publication's steps over ``clients`` in the safe order."""

    def __init__(
        self,
        clients: Sequence[FleetClient],
        *,
        plan: InflightPlan = "finish",
        gate: AdmissionGate | None = None,
        clock: Clock | None = None,
        keep_kv: bool = False,
        reset_cache: bool = True,
        abort_only: bool = False,
    ) -> None:
        if not clients:
            raise ValueError("a fleet needs at least one server")
        self.clients = list(clients)
        self.plan: InflightPlan = plan
        self.gate = gate or AdmissionGate()
        for c in self.clients:
            c.set_admission(self.gate)
        self.clock = clock or MonotonicClock()
        self.keep_kv = keep_kv
        # False: no prefix-cache reset at all, for updates whose new requests cannot hit an
        # older version's blocks whatever the plan (LoRA: the hash covers the adapter's name)
        self.reset_cache = reset_cache
        # plan "abort" without pausing the engines: every client aborts what it has in flight
        # (clients with ``inflight_ids`` and ``abort(*ids)``), nothing to resume; for updates
        # that leave the running weights alone (LoRA: a new adapter). Saves the pause and
        # resume round trips (and vLLM's fixed 20 ms sleep in its pause)
        self.abort_only = abort_only

    def _skips_reset(self, mode: PauseMode) -> bool:
        return not self.reset_cache or (mode == "keep" and self.keep_kv)

    async def _reset(self, mode: PauseMode) -> list[BaseException | None]:
        if self._skips_reset(mode):
            return []
        if mode != "keep":  # nothing runs: the reset succeeds (retried while blocks drain)
            return await self.all("reset", lambda c: c.reset_prefix_cache())
        # frozen requests hold blocks: preempt them so their KV is recomputed with the new
        # weights after the resume, and the prefix cache can be emptied now
        return await self.all("reset", lambda c: c.reset_prefix_cache(attempts=2, reset_running_requests=True))

    async def _abort_inflight(self, c: FleetClient, timeout_s: float = 30.0) -> None:
        """Abort every request ``c`` sent until each has answered (repeated: a request not
        yet added to the engine ignores an abort); admission is closed, nothing new comes."""
        client: Any = c
        deadline = self.clock.now() + timeout_s
        while ids := client.inflight_ids:
            if self.clock.now() > deadline:
                raise InferenceError(f"{len(ids)} aborted requests never answered", server=c.base_url)
            await client.abort(*ids)
            await asyncio.sleep(0.005)

    async def _stop(self, mode: PauseMode) -> list[BaseException | None]:
        if self.abort_only and mode == "abort":
            return await self.all("abort", self._abort_inflight)
        return await self.all("pause", lambda c: c.pause(mode, clear_cache=False))

    async def all(self, name: str, step: Step) -> list[BaseException | None]:
        async def one(c: FleetClient) -> BaseException | None:
            try:
                await step(c)
            except Exception as exc:
                return exc
            return None

        return list(await asyncio.gather(*(one(c) for c in self.clients)))

    async def serving(self) -> tuple[dict[str, int], tuple[str, ...]]:
        """(engine -> version it reports, engines that did not answer)."""
        versions: dict[str, int] = {}
        lost: list[str] = []
        for c, v in zip(self.clients, await asyncio.gather(
            *(c.engine_version() for c in self.clients), return_exceptions=True), strict=True):
            if isinstance(v, BaseException):
                lost.append(c.base_url)
            else:
                versions[c.base_url] = v
        return versions, tuple(lost)

    async def publish(
        self,
        *,
        pattern: str,
        version: int,
        previous_version: int,
        ready_at: float,
        apply: Step,
        rollback: Step | None,
        steps: dict[str, float] | None = None,
        tensors: int = 0,
        nbytes: int = 0,
    ) -> PublicationRecord:
        """Pause, ``apply`` everywhere (``rollback`` everywhere on failure), reset, resume."""
        steps = steps if steps is not None else {}  # the apply step may add its own timings
        mode = PLAN_TO_PAUSE[self.plan]
        was_open = self.gate.is_open  # the owner's admission (e.g. the sync loop's) is restored
        self.gate.close()
        first_error: BaseException | None = None
        try:
            paused_at = t = self.clock.now()
            errors = await self._stop(mode)
            steps["pause_s"] = (t2 := self.clock.now()) - t
            if any(errors):
                first_error = next(e for e in errors if e is not None)
            else:
                errors = await self.all("apply", apply)
                steps["apply_s"] = (t3 := self.clock.now()) - t2
                if any(errors):
                    first_error = next(e for e in errors if e is not None)
                    if rollback is not None:
                        await self.all("rollback", rollback)
                    steps["rollback_s"] = self.clock.now() - t3
            t4 = self.clock.now()
            # A refused reset is recorded, not fatal: the weights are consistent either way.
            reset_errors = await self._reset(mode)
            steps["reset_s"] = (t5 := self.clock.now()) - t4
            steps["cache_reset_failed"] = float(sum(e is not None for e in reset_errors))
            steps["cache_reset_skipped"] = float(self._skips_reset(mode))
            if not (self.abort_only and mode == "abort"):  # nothing paused otherwise
                await self.all("resume", lambda c: c.resume())
            resumed_at = self.clock.now()
            steps["resume_s"] = resumed_at - t5
            serving, lost = await self.serving()  # read back before anything new is admitted
        finally:
            if was_open:
                self.gate.open()
        serving_at = resumed_at
        record = PublicationRecord(
            pattern=pattern, version=version, previous_version=previous_version,
            plan=self.plan, ready_at=ready_at, paused_at=paused_at, resumed_at=resumed_at,
            serving_at=serving_at, tensors=tensors, bytes=nbytes, steps_s=steps,
            serving=serving, lost=lost, ok=first_error is None,
            error=None if first_error is None else repr(first_error),
        )  # fmt: skip
        if first_error is not None:
            raise PublicationError(
                f"{pattern} publication of version {version} failed ({first_error!r}); engines "
                f"serve {serving}" + (f", unreachable: {list(lost)}" if lost else ""),
                serving=serving, record=record,
            ) from first_error
        wrong = {u: v for u, v in serving.items() if v != version}
        if wrong or lost:
            raise PublicationError(
                f"{pattern} publication of version {version}: engines report {serving}"
                + (f", unreachable: {list(lost)}" if lost else ""),
                serving=serving, record=record,
            )
        return record
