"""Checkpoint pattern: an atomic versioned safetensors directory, hot-reloaded by every engine.

The trainer hands over a directory (already written atomically, e.g. by
``rollbank.training``) or tensors, which are written here to ``root/v<version>`` through a
temporary directory, fsync'd, then one ``rename`` (:func:`rollbank.atomic.write_dir`: a reader
never sees half a checkpoint, a crash leaves the old or the new one whole; a full disk fails the
write before any engine is paused). Engines reload it with
``collective_rpc reload_weights`` and name the version (``/update_weight_version``); rollback
reloads the previous directory under the previous version.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rollbank.atomic import StepHook, write_dir
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
from rollbank.inference.publishing.state import read_safetensors_meta, validate

_CONFIG_SUFFIXES = (".json", ".model", ".txt", ".jinja")


class ReloadClient(FleetClient, Protocol):
    async def reload_weights(self, weights_path: str, *, version: int) -> None: ...


def write_checkpoint(
    tensors: Mapping[str, Any], root: Path, version: int, *, template: Path | None = None,
    step: StepHook | None = None,
) -> Path:
    """Write ``root/v<version>/model.safetensors`` atomically (config files from ``template``),
    replacing an earlier ``v<version>`` only once the new one is complete (:mod:`rollbank.atomic`)."""
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        if template is not None:
            for f in template.iterdir():
                if f.is_file() and f.suffix in _CONFIG_SUFFIXES:
                    shutil.copy2(f, tmp / f.name)
        save_file({k: v.detach().contiguous() for k, v in tensors.items()},
                  str(tmp / "model.safetensors"), metadata={"format": "pt"})

    return write_dir(root / f"v{version}", write, replace=True, step=step)


class CheckpointPublisher:
    """Publishes full checkpoints by hot reload (no restart).

    ``base_dir``: the served model's folder, the reference of tensor names and shapes and the
    rollback target of the first publication. None (an engine whose model rollbank does not
    have, e.g. fake servers): the first checkpoint published becomes the reference, and a
    failed first publication rolls nothing back (there is no earlier checkpoint to reload)."""

    def __init__(
        self,
        clients: Sequence[ReloadClient],
        base_dir: Path | None,
        *,
        root: Path | None = None,
        plan: InflightPlan = "finish",
        version: int = 0,
        gate: AdmissionGate | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.clients = list(clients)
        self.base_dir = base_dir
        self.reference = None if base_dir is None else read_safetensors_meta(base_dir)
        self.root = root
        self.clock = clock or MonotonicClock()
        self.fleet = Fleet(self.clients, plan=plan, gate=gate, clock=self.clock)
        self._version = version
        self.current_path = None if base_dir is None else str(base_dir)
        self.records: list[PublicationRecord] = []

    @property
    def pattern(self) -> Pattern:
        return "checkpoint"

    @property
    def wants_tensors(self) -> bool:
        return False

    @property
    def version(self) -> int:
        return self._version

    def _serving(self) -> dict[str, int]:
        return {c.base_url: self._version for c in self.clients}

    def _step(self, path: str, version: int) -> Step:
        by_url = {c.base_url: c for c in self.clients}

        async def step(fc: FleetClient) -> None:
            await by_url[fc.base_url].reload_weights(path, version=version)

        return step

    async def publish(
        self, update: WeightUpdate, *, version: int, ready_at: float | None = None
    ) -> PublicationRecord:
        ready = self.clock.now() if ready_at is None else ready_at
        if update.lora:
            raise PublicationError("adapters are published by the lora pattern", serving=self._serving())
        steps: dict[str, float] = {}
        t0 = self.clock.now()
        if update.tensors is not None:
            if self.root is None:
                raise PublicationError("tensors need a checkpoint root", serving=self._serving())
            if self.reference is not None:
                validate(((n, tuple(t.shape)) for n, t in update.tensors.items()), self.reference,
                         serving=self._serving())
            try:
                path = await asyncio.to_thread(
                    write_checkpoint, update.tensors, self.root, version, template=self.base_dir)
            except OSError as exc:  # e.g. disk full: nothing was paused
                raise PublicationError(f"checkpoint write failed: {exc}", serving=self._serving()) from exc
            steps["write_s"] = self.clock.now() - t0
        else:
            assert update.path is not None
            path = Path(update.path)
            try:
                meta = await asyncio.to_thread(read_safetensors_meta, path)
            except (OSError, ValueError) as exc:  # no checkpoint there: nothing was paused
                raise PublicationError(f"not a checkpoint directory {path}: {exc}",
                                       serving=self._serving()) from exc
            if self.reference is not None:
                validate(((n, s) for n, (s, _) in meta.items()), self.reference, serving=self._serving())
                missing = sorted(set(self.reference) - set(meta))
                if missing:
                    raise PublicationError(f"checkpoint {path} lacks {missing[:5]}", serving=self._serving())
        reference = self.reference  # the first checkpoint becomes the reference of the next ones
        if reference is None:
            reference = await asyncio.to_thread(read_safetensors_meta, path)
        tensors = len(reference)
        nbytes = await asyncio.to_thread(_size, path)
        record = await self.fleet.publish(
            pattern="checkpoint", version=version, previous_version=self._version, ready_at=ready,
            apply=self._step(str(path), version),
            rollback=None if self.current_path is None else self._step(self.current_path, self._version),
            steps=steps, tensors=tensors, nbytes=nbytes,
        )  # fmt: skip
        self.reference = reference
        self.current_path = str(path)
        self._version = version
        self.records.append(record)
        return record

    async def aclose(self) -> None:
        return None


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))
