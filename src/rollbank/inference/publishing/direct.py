"""Direct pattern: tensors from the trainer process to running vLLM servers, no checkpoint.

Control plane: vLLM 0.32's native weight-sync routes, per server
``/init_weight_transfer_engine`` (once) -> ``/start_weight_update`` -> ``/update_weights`` ->
``/finish_weight_update {weight_version}``. Data plane: rollbank's ``rollbank_shm`` backend
(:mod:`rollbank.inference.publishing.vllm_plugin`; servers started with
``ServerConfig.weight_transfer_backend="rollbank_shm"``): the trainer writes the tensors into
one ``/dev/shm`` file and (``stage=True``, the default) every server opens its update session
and prepares the update in its worker, all *while generation goes on*: with ``prepare=True``
(default) the worker reloads the file into a shadow of its model (name mapping, fusing, the
CPU GEMM repack; :mod:`~rollbank.inference.publishing.staged_reload`), so inside the pause only
a swap (in-place copies of the changed tensors, pointer swaps of the repacked kernels;
``/update_weights`` phase ``apply``) and the version label (``/update_weight_version``)
remain; ``prepare=False`` only copies the file into the worker and reloads the live model in
the pause. ``stage=False`` is the earliest order (start, load from the file, finish, all in
the pause). The last two are kept for before/after comparisons. Same host only.

Compact updates (``compact=True``): only tensors that differ from what the engines serve are
sent (whole fused parameters: q/k/v, gate/up), unless a server reports another version than
the last one installed (e.g. it was restarted onto the checkpoint's weights): then the whole
state goes out. Rollback re-sends the previous values of the tensors that were sent, from the
trainer-side copy (:class:`ServedWeights`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rollbank.clock import Clock, MonotonicClock
from rollbank.errors import PublicationError
from rollbank.inference.protocol import AdmissionGate
from rollbank.inference.publishing.fleet import Fleet, FleetClient, Step
from rollbank.inference.publishing.protocol import (
    InflightPlan,
    Pattern,
    PublicationRecord,
    WeightUpdate,
)
from rollbank.inference.publishing.shm import ShmBuffer, ShmLayout
from rollbank.inference.publishing.state import ServedWeights, validate


class WeightSyncClient(FleetClient, Protocol):
    """A server with vLLM's weight-sync routes (VLLMClient has them)."""

    async def init_weight_transfer_engine(self, init_info: Mapping[str, Any]) -> None: ...

    async def start_weight_update(self) -> None: ...

    async def update_weights(self, update_info: Mapping[str, Any]) -> None: ...

    async def finish_weight_update(self, *, version: int | None) -> None: ...

    async def set_weight_version(self, version: int) -> None: ...


class DirectPublisher:
    """Pushes state dicts to running servers through the weight-sync routes."""

    def __init__(
        self,
        clients: Sequence[WeightSyncClient],
        served: ServedWeights,
        *,
        plan: InflightPlan = "pause",
        compact: bool = True,
        version: int = 0,
        gate: AdmissionGate | None = None,
        clock: Clock | None = None,
        shm_dir: Path | None = None,
        stage: bool = True,
        prepare: bool = True,
    ) -> None:
        self.clients = list(clients)
        self.served = served
        self.compact = compact
        self.stage = stage
        self.prepare = prepare
        self.clock = clock or MonotonicClock()
        self.fleet = Fleet(self.clients, plan=plan, gate=gate, clock=self.clock)
        self._version = version
        kw = {} if shm_dir is None else {"directory": shm_dir}
        self._buffer = ShmBuffer("update", **kw)
        self._rollback_buffer = ShmBuffer("rollback", **kw)
        self._initialized = False
        self.records: list[PublicationRecord] = []

    @property
    def pattern(self) -> Pattern:
        return "direct"

    @property
    def wants_tensors(self) -> bool:
        return True

    @property
    def version(self) -> int:
        return self._version

    async def _init(self) -> None:
        if not self._initialized:
            await asyncio.gather(*(c.init_weight_transfer_engine(
                {"directory": str(self._buffer.path.parent)}) for c in self.clients))
            self._initialized = True

    def _lap(self, steps: dict[str, float], name: str, since: float) -> float:
        now = self.clock.now()
        steps[name] = max(steps.get(name, 0.0), now - since)  # the slowest server's
        return now

    def _info(self, path: Path, layout: ShmLayout, phase: str) -> dict[str, Any]:
        extra: dict[str, Any] = {"phase": phase}
        if phase == "stage":
            extra["prepare"] = self.prepare
        return {"path": str(path), **layout.to_dict(), "extra": extra}

    async def _stage_on(self, c: WeightSyncClient, info: Mapping[str, Any]) -> None:
        """Open the session and copy the buffer into the server (the model is untouched)."""
        await c.start_weight_update()
        try:
            await c.update_weights(info)
        except BaseException:
            with contextlib.suppress(Exception):
                await c.finish_weight_update(version=None)
            raise

    def _step(self, path: Path, layout: ShmLayout, version: int, steps: dict[str, float],
              *, staged: bool) -> Step:
        """The apply step on one server (inside the pause). ``staged``: the session is open
        and the update prepared: install it (a worker round trip: a swap, or a reload of the
        copied buffer + finalize) and name the version (``/update_weight_version``: engine
        core only), concurrently; the session is closed after the resume.
        Otherwise (rollback, or ``stage=False``): start, load from the file, finish naming the
        version (three worker round trips)."""
        by_url = {c.base_url: c for c in self.clients}

        async def step(fc: FleetClient) -> None:
            c = by_url[fc.base_url]
            t = self.clock.now()
            if staged:  # the swap and the label are independent: both go out at once
                async def apply() -> None:
                    await c.update_weights(self._info(path, layout, "apply"))
                    self._lap(steps, "update_route_s", t)

                async def label() -> None:
                    await c.set_weight_version(version)
                    self._lap(steps, "label_route_s", t)

                results = await asyncio.gather(apply(), label(), return_exceptions=True)
                failed = [r for r in results if isinstance(r, BaseException)]
                if failed:  # the rollback step restores the weights and the previous label
                    with contextlib.suppress(Exception):
                        await c.finish_weight_update(version=None)
                    raise failed[0]
                return
            with contextlib.suppress(Exception):  # a session left open by a failed apply
                await c.finish_weight_update(version=None)
            await c.start_weight_update()
            t = self._lap(steps, "start_route_s", t)
            try:
                await c.update_weights(self._info(path, layout, "load"))
            except BaseException:
                with contextlib.suppress(Exception):  # close the engine's update session
                    await c.finish_weight_update(version=None)
                raise
            t = self._lap(steps, "update_route_s", t)
            await c.finish_weight_update(version=version)
            self._lap(steps, "finish_route_s", t)

        return step

    async def publish(
        self, update: WeightUpdate, *, version: int, ready_at: float | None = None
    ) -> PublicationRecord:
        ready = self.clock.now() if ready_at is None else ready_at
        if update.tensors is None or update.lora:
            raise PublicationError("the direct pattern publishes full-model tensors (use lora/checkpoint)",
                                   serving={c.base_url: self._version for c in self.clients})
        tensors = update.tensors
        validate(((n, tuple(t.shape)) for n, t in tensors.items()), self.served.reference,
                 serving={c.base_url: self._version for c in self.clients})
        steps: dict[str, float] = {}
        t0 = self.clock.now()
        # A server that does not report the version we last installed (restarted: back to the
        # checkpoint's weights) would get a mix from a compact update: send everything then.
        versions, _ = await self.fleet.serving()
        drifted = any(v != self._version for v in versions.values())
        steps["drifted"] = float(drifted)
        send = self.served.changed(tensors, compact=self.compact and not drifted)
        previous = self.served.previous_of(send)
        steps["diff_s"] = (t1 := self.clock.now()) - t0
        try:
            await self._init()
            layout = await asyncio.to_thread(self._buffer.write, send)  # staged during generation
            rb_layout = await asyncio.to_thread(self._rollback_buffer.write, previous)
        except OSError as exc:  # e.g. /dev/shm full: nothing was paused
            self._buffer.close()
            self._rollback_buffer.close()
            raise PublicationError(f"staging the tensors failed: {exc}; engines keep version "
                                   f"{self._version}", serving=versions) from exc
        steps["stage_s"] = (t2 := self.clock.now()) - t1
        if self.stage:  # every server copies the buffer while it still generates
            info = self._info(self._buffer.path, layout, "stage")
            results = await asyncio.gather(*(self._stage_on(c, info) for c in self.clients),
                                           return_exceptions=True)
            failed = [r for r in results if isinstance(r, BaseException)]
            if failed:
                await self._close_sessions()
                raise PublicationError(f"staging on the servers failed ({failed[0]!r}); engines keep "
                                       f"version {self._version}", serving=versions) from failed[0]
            steps["server_stage_s"] = self.clock.now() - t2
        prev_version = self._version
        try:
            record = await self.fleet.publish(
                pattern="direct", version=version, previous_version=prev_version, ready_at=ready,
                apply=self._step(self._buffer.path, layout, version, steps, staged=self.stage),
                rollback=self._step(self._rollback_buffer.path, rb_layout, prev_version, {}, staged=False),
                steps=steps, tensors=len(send), nbytes=layout.nbytes,
            )  # fmt: skip
        except PublicationError:
            await self._close_sessions()  # e.g. the pause failed after staging: nothing applied
            raise
        if self.stage:  # generation runs again: end the update sessions (names nothing)
            t3 = self.clock.now()
            await self._close_sessions()
            record.steps_s["close_s"] = self.clock.now() - t3
        self.served.commit(send)
        self._version = version
        self.records.append(record)
        return record

    async def _close_sessions(self) -> None:
        """Close any update session left open (a no-op error where none is)."""
        await asyncio.gather(*(c.finish_weight_update(version=None) for c in self.clients),
                             return_exceptions=True)

    async def aclose(self) -> None:
        self._buffer.close()
        self._rollback_buffer.close()
