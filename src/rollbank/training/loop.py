"""The training loop: batches from the collector -> trainer step -> checkpoint -> publication.

Owns :class:`TrainingLoop` (the consumer the collector calls per written batch, and an
:class:`~rollbank.scheduling.policy.events.EventSink`). It publishes through the one
publication seam, :class:`rollbank.inference.publishing.protocol.Publisher` (validation before
the pause, the safe order, rollback; ``training/loop_publish.py`` builds the pattern the config
names). Modes and in-flight plans are described in :mod:`rollbank.training.loop_config`.

Versions: the engines start at version 0 (the initial weights); optimizer step ``k`` produces
version ``k``. A batch's *policy age* is ``trainer version - oldest token version`` in it,
measured from the per-token versions the engines reported (``policy_versions`` of the batch).

Invariants
- sync: admission closes synchronously when the driver emits a batch (``BATCH_READY``, before
  any newly launched attempt can run) and reopens only after the new version is served on every
  engine (or the step failed), unless a later batch was already handed out: then it stays closed
  until that one is trained on too. Steps, saves and publications happen strictly in order.
- async: admission is open only while a token generated now would be at most ``max_lag``
  versions old when trained on (``expected_age``: trainer version + batches handed out and not
  yet consumed - served version), so the collector does not run ahead into waste (and it is
  that gate which bounds it: collection may complete up to ``max_lag`` batches while the
  trainer is busy, ``loop_run.batches_ahead``); step ``v``
  starts only once the engines serve ``>= v - max_lag``; and no batch whose measured policy age
  exceeds ``max_lag`` is trained on (requests admitted before the gate closed, carried
  stragglers): it is recorded as stale and not stepped.
- After each publication of ``v`` the router is told ``on_weight_version(server, v)`` for every
  server (its prefix-affinity beliefs are void), then the record is written.
- The trainer and the checkpoint writes run in worker threads: the event loop never blocks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rollbank.batching.batch import Batch
from rollbank.batching.loader import TensorBatch, read_batch_dir, table_to_tensors
from rollbank.clock import Clock, MonotonicClock
from rollbank.inference.protocol import AdmissionGate
from rollbank.inference.publishing.protocol import Publisher, update_of
from rollbank.routing.router import Router
from rollbank.scheduling.policy.events import BatchEvent, Event, EventKind
from rollbank.training.loop_config import LoopSettings
from rollbank.training.loop_metrics import gate_record, progress_line

Weights = Path | Mapping[str, Any]  # a saved version directory, or tensors (name -> tensor)


class StepTrainer(Protocol):
    """One optimizer step per batch, versioned saves, tensor copies (blocking; run in a thread)."""

    def train(self, batch: TensorBatch) -> dict[str, float]: ...

    def save(self, root: Path, version: int) -> Path: ...

    def tensors(self) -> Mapping[str, Any]:
        """A copy of the weights to publish (training may go on while they are sent)."""
        ...


def batch_versions(batch: TensorBatch) -> dict[int, int]:
    """Model tokens per weight version in ``batch`` (``policy_versions`` on the loss mask)."""
    sel = (batch.loss_mask > 0) & (batch.policy_versions >= 0)
    out: dict[int, int] = {}
    for v in batch.policy_versions[sel].tolist():
        out[int(v)] = out.get(int(v), 0) + 1
    return dict(sorted(out.items()))


def load_tensors(path: Path) -> TensorBatch:
    return table_to_tensors(read_batch_dir(path))


class TrainingLoop:
    """Consumes written batches (``on_batch``), trains, saves, publishes; see the module doc."""

    def __init__(
        self,
        settings: LoopSettings,
        trainer: StepTrainer,
        publisher: Publisher,
        *,
        gate: AdmissionGate,
        servers: Sequence[str],
        weights_root: Path,
        router: Router | None = None,
        record: Callable[[dict[str, Any]], None] | None = None,
        progress: Callable[[str], None] | None = None,
        clock: Clock | None = None,
        load: Callable[[Path], TensorBatch] = load_tensors,
        remember: Callable[[str, int], None] | None = None,
    ) -> None:
        self.settings = settings
        self.trainer = trainer
        self.publisher = publisher
        self.gate = gate
        self.servers = list(servers)
        self.weights_root = weights_root
        self.router = router
        self._record = record or (lambda _r: None)
        self._progress = progress or (lambda _s: None)
        self.clock = clock or MonotonicClock()
        self._load = load
        self._remember = remember  # managed servers: what a restarted server re-applies
        self._saved: dict[int, Path] = {}  # full checkpoints by version, for ``remember``
        self.version = 0  # of the trainer's weights
        self.published = 0  # what every engine serves
        self.steps: list[dict[str, Any]] = []
        self.publications: list[dict[str, Any]] = []
        self.stale: list[dict[str, Any]] = []
        self._t0 = self.clock.now()
        self._last_end = self._t0
        self._pending: tuple[int, Weights, float] | None = None
        self._changed = asyncio.Condition()
        self._worker: asyncio.Task[None] | None = None
        self._error: BaseException | None = None
        self._handed_out: set[int] = set()  # batches handed out, not yet trained on (or dropped)

    # ------------------------------------------------------------ EventSink
    def emit(self, event: Event) -> None:
        if isinstance(event, BatchEvent) and event.kind is EventKind.BATCH_READY:
            self._handed_out.add(event.batch_index)
            self._admit()

    # ------------------------------------------------------------ admission
    def expected_age(self) -> int:
        """Policy age a token generated now would have when its batch is trained on: the
        batches already handed out train first, each adding a version (unless dropped)."""
        return self.version + len(self._handed_out) - self.published

    def _admit(self) -> None:
        """sync: closed while any handed-out batch is not trained on and published.
        async: closed while a new token would be more than ``max_lag`` versions old."""
        if self.settings.mode == "sync":
            closed = bool(self._handed_out)
        else:
            closed = self.expected_age() > self.settings.max_lag
        if closed:
            self.gate.close()
        else:
            self.gate.open()

    # ------------------------------------------------------------ consumer
    async def on_batch(self, batch: Batch, path: Path) -> None:
        """Train on the written batch ``path`` (``batch`` is its in-memory form)."""
        try:
            await self._on_batch(batch, path)
        finally:
            self._handed_out.discard(batch.index)
            self._admit()

    async def _on_batch(self, batch: Batch, path: Path) -> None:
        s = self.settings
        t_in = self.clock.now()
        tensors = await asyncio.to_thread(self._load, path)
        versions = batch_versions(tensors)
        age = self.version - min(versions) if versions else 0
        rows = tensors.rewards.numel()
        rec: dict[str, Any] = {
            "kind": "step", "batch_index": batch.index, "batch_dir": str(path),
            "trainer_version": self.version, "engine_version": self.published,
            "policy_age": age, "versions": {str(v): n for v, n in versions.items()},
            "reward_mean": float(tensors.rewards.mean().item()) if rows else 0.0,
            "trajectories": rows, "received_s": t_in - self._t0,
            "gate": gate_record(batch.staleness),
        }
        if s.mode == "async" and age > s.max_lag:
            rec.update(kind="stale", dropped=True)
            self.stale.append(rec)
            self._record(rec)
            self._progress(f"batch {batch.index}: policy age {age} > max_lag {s.max_lag}, "
                           f"versions {sorted(versions)}: not trained on")
            return
        if s.mode == "async":
            await self._wait_published(self.version + 1 - s.max_lag)
        t_train = self.clock.now()
        metrics = await asyncio.to_thread(self.trainer.train, tensors)
        t_done = self.clock.now()
        self.version += 1
        update: Weights
        saved: Path | None = None
        save_s = 0.0
        if self.publisher.wants_tensors:
            update = await asyncio.to_thread(self.trainer.tensors)
        else:
            update = saved = await asyncio.to_thread(self.trainer.save, self.weights_root, self.version)
            save_s = self.clock.now() - t_done
        rec.update(version=self.version, wait_s=t_train - t_in, train_s=t_done - t_train, **metrics)
        if s.mode == "sync":
            pub = await self._publish(self.version, update, t_done)
            rec.update(publication_s=pub["publication_s"], apply_pause_s=pub["apply_pause_s"])
        else:
            self._enqueue(self.version, update, t_done)
        if saved is None:  # tensors were published: the checkpoint is the record, written after
            t_save = self.clock.now()
            saved = await asyncio.to_thread(self.trainer.save, self.weights_root, self.version)
            save_s = self.clock.now() - t_save
        self._saved[self.version] = saved
        self._remember_served()
        rec.update(weights=str(saved), save_s=save_s)
        end = self.clock.now()
        rec.update(step_s=end - self._last_end, done_s=end - self._t0)
        self._last_end = end
        self.steps.append(rec)
        self._record(rec)
        self._progress(progress_line(rec, s.steps))

    # ------------------------------------------------------------ publication
    async def _publish(self, version: int, weights: Weights, ready_at: float) -> dict[str, Any]:
        """Publish and record: ``publication_s`` on the loop's clock (trainer step done -> every
        engine serving ``version``, queueing behind an earlier publication included) apart from
        ``apply_pause_s`` (generation stopped); ``detail`` = the publisher's own record."""
        update = update_of(weights, lora=self.publisher.pattern == "lora")
        pub = await self.publisher.publish(update, version=version)
        serving = self.clock.now()
        self.published = version
        self._remember_served()
        self._admit()  # the publisher reopened admission; the lag may still keep it closed
        if self.router is not None:
            for server in self.servers:
                self.router.on_weight_version(server, version)
        rec = {"kind": "publication", "version": version, "publication_s": serving - ready_at,
               "apply_pause_s": pub.apply_pause_s, "serving_s": serving - self._t0,
               "pattern": pub.pattern, "detail": pub.to_dict()}
        self.publications.append(rec)
        self._record(rec)
        async with self._changed:
            self._changed.notify_all()
        return rec

    def _remember_served(self) -> None:
        """Tell the managed servers which checkpoint a restarted server must load: the one of
        the version every engine serves, once it is both published and saved (async publishes
        before the save ends). Without it a restarted engine came back on the initial weights."""
        path = self._saved.get(self.published)
        if self._remember is not None and path is not None:
            self._remember(str(path), self.published)
        for v in [v for v in self._saved if v < self.published]:
            del self._saved[v]

    def _enqueue(self, version: int, weights: Weights, ready_at: float) -> None:
        """async: publish ``version`` in the background (a newer pending one supersedes it)."""
        self._pending = (version, weights, ready_at)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain(), name="rollbank-publisher")

    async def _drain(self) -> None:
        try:
            while self._pending is not None:
                version, weights, ready_at = self._pending
                self._pending = None
                await self._publish(version, weights, ready_at)
        except Exception as exc:
            self._error = exc
            async with self._changed:
                self._changed.notify_all()

    async def _wait_published(self, version: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: self.published >= version or self._error is not None)
        if self._error is not None:
            raise self._error

    async def finish(self) -> None:
        """Wait until the trainer's last version is served (async); re-raise a failed publication."""
        if self._worker is not None:
            await asyncio.shield(self._worker)
        if self._error is not None:
            raise self._error

    async def aclose(self) -> None:
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)

    def summary(self) -> dict[str, Any]:
        pubs = {p["version"]: p for p in self.publications}
        steps = []
        for r in self.steps:
            p = pubs.get(r["version"], {})
            steps.append({**r, "publication_s": p.get("publication_s"),
                          "apply_pause_s": p.get("apply_pause_s")})
        return {"mode": self.settings.mode, "max_lag": self.settings.max_lag,
                "inflight": self.settings.inflight, "final_version": self.version,
                "served_version": self.published, "steps": steps, "stale": self.stale,
                "publications": self.publications}
