"""Publish a checkpoint to every inference server in the documented safe order.

Owns :class:`WeightPublisher` (:class:`AdmissionGate` lives in ``protocol.py`` and is
re-exported here). The publication patterns behind one ``Publisher`` seam (checkpoint with
validation and rollback, direct transfer, colocated, LoRA) are in
:mod:`rollbank.inference.publishing`; this class stays as the minimal checkpoint path.

Order (engine-apis-and-routing.md): close admission -> pause every server -> reload the
weights on every server and name their version on the engine -> reset every prefix cache ->
resume -> reopen admission. Servers are handled concurrently within each step, and a step
starts only when the previous one finished on all servers, so no server resumes before every
server holds the new weights.

Invariants
- The publisher's gate is installed on every client it is given (``set_admission``), and every
  client waits on it before sending a generation: nothing is sent while admission is closed.
- A token is tagged with the version of the weights that produced it by the engine itself:
  ``reload_weights(path, version=v)`` names ``v`` on the engine after the reload succeeded,
  and the engine reports per-token versions (``GenerateResult.token_versions``). With pause
  mode ``keep`` a request that straddles the update carries both versions, correctly split.
- If a reload fails on some server, every server is still reset and resumed (collection goes
  on; each client keeps reporting the version it really holds) and the error is re-raised.
- Two latencies are measured separately: ``publication_s`` = checkpoint ready -> every server
  serving the new version; ``apply_pause_s`` = how long generation was paused.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from rollbank.clock import Clock, MonotonicClock
from rollbank.inference.protocol import AdmissionGate, InferenceClient, PauseMode

__all__ = ["AdmissionGate", "PublishReport", "WeightPublisher"]


@dataclass(frozen=True)
class PublishReport:
    """Timings (seconds, on the publisher's clock) of one publication."""

    version: int
    weights_path: str
    ready_at: float
    paused_at: float
    reloaded_at: float
    serving_at: float
    step_s: dict[str, float] = field(default_factory=dict)
    failed: tuple[str, ...] = ()

    @property
    def publication_s(self) -> float:
        return self.serving_at - self.ready_at

    @property
    def apply_pause_s(self) -> float:
        return self.serving_at - self.paused_at

    def to_dict(self) -> dict[str, object]:
        return {
            "version": self.version,
            "weights_path": self.weights_path,
            "publication_s": self.publication_s,
            "apply_pause_s": self.apply_pause_s,
            "steps_s": dict(self.step_s),
            "failed": list(self.failed),
        }


class WeightPublisher:
    """Applies checkpoints to a fleet of :class:`InferenceClient`."""

    def __init__(
        self,
        clients: Sequence[InferenceClient],
        *,
        gate: AdmissionGate | None = None,
        pause_mode: PauseMode = "wait",
        clock: Clock | None = None,
        on_published: Callable[[str, int], None] | None = None,
    ) -> None:
        self.clients = list(clients)
        self.gate = gate or AdmissionGate()
        for c in self.clients:
            c.set_admission(self.gate)
        self.pause_mode = pause_mode
        self.clock = clock or MonotonicClock()
        self.on_published = on_published
        self.reports: list[PublishReport] = []

    async def _all(
        self, name: str, make: Callable[[InferenceClient], Awaitable[None]]
    ) -> list[BaseException | None]:
        async def one(c: InferenceClient) -> BaseException | None:
            try:
                await make(c)
            except Exception as exc:
                return exc
            return None

        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(one(c), name=f"{name}:{c.base_url}") for c in self.clients]
        return [t.result() for t in tasks]

    async def publish(self, weights_path: str, *, version: int, ready_at: float | None = None) -> PublishReport:
        """Apply ``weights_path`` as ``version`` everywhere; ``ready_at`` = when it was written."""
        ready = self.clock.now() if ready_at is None else ready_at
        steps: dict[str, float] = {}
        self.gate.close()
        try:
            t = paused_at = self.clock.now()
            errors = await self._all("pause", lambda c: c.pause(self.pause_mode, clear_cache=False))
            _raise_first(errors)
            steps["pause_s"] = (t2 := self.clock.now()) - t
            reload_errors = await self._all("reload", lambda c: c.reload_weights(weights_path, version=version))
            steps["reload_s"] = (t3 := self.clock.now()) - t2
            reloaded_at = t3
            reset_errors = await self._all("reset", lambda c: c.reset_prefix_cache())
            steps["reset_s"] = (t4 := self.clock.now()) - t3
            resume_errors = await self._all("resume", lambda c: c.resume())
            serving_at = self.clock.now()
            steps["resume_s"] = serving_at - t4
        finally:
            self.gate.open()
        failed = tuple(
            c.base_url for c, e in zip(self.clients, reload_errors, strict=True) if e is not None
        )
        report = PublishReport(version, weights_path, ready, paused_at, reloaded_at, serving_at, steps, failed)
        self.reports.append(report)
        _raise_first(reload_errors + reset_errors + resume_errors)
        if self.on_published is not None:
            self.on_published(weights_path, version)
        return report


def _raise_first(errors: list[BaseException | None]) -> None:
    for e in errors:
        if e is not None:
            raise e
