"""Weights & Biases logging for a collection, offline only (``pip install 'rollbank[wandb]'``).

:class:`WandbSink` is an :class:`~rollbank.scheduling.policy.events.EventSink`: it logs the scalar
series of :mod:`rollbank.metrics.scalars` to a :class:`WandbRun`, each series against its own
step metric (``attempt/step``: finished attempts; ``batch/step``: batch index), declared
with ``define_metric`` so W&B plots them on the right x axis.

:func:`open_wandb` starts a real run in **offline mode** (``mode="offline"``; the process
environment gets ``WANDB_MODE=offline`` too, so nothing the library starts goes online):
the run is written under ``<dir>/wandb/offline-run-*`` and never contacts a server; upload it
later, if wanted, with ``wandb sync <that folder>``.

Invariants
- :meth:`WandbSink.emit` hands the values to the run's local writer (wandb-core); it does no
  network I/O. :func:`open_wandb` and :meth:`WandbSink.close` start and stop that writer
  process and block for a moment: call them off the event loop (``asyncio.to_thread``).
- The run's file is complete once the writer service stops: at process exit (wandb's own
  exit hook) or at ``wandb.teardown()``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from rollbank.extras import require
from rollbank.metrics.scalars import AXES, EventScalars
from rollbank.scheduling.policy.events import Event


class WandbRun(Protocol):
    """The part of ``wandb.Run`` the sink uses."""

    def define_metric(self, name: str, step_metric: str | None = None) -> object: ...

    def log(self, data: dict[str, Any]) -> None: ...

    def finish(self) -> None: ...


class WandbSink:
    def __init__(self, run: WandbRun) -> None:
        self.run = run
        self.scalars = EventScalars()
        self.points = 0
        for axis in AXES:
            run.define_metric(f"{axis}/step")
            run.define_metric(f"{axis}/*", step_metric=f"{axis}/step")

    def emit(self, event: Event) -> None:
        points = self.scalars.of(event)
        if not points:
            return
        data: dict[str, Any] = {s.tag: s.value for s in points}
        data[f"{points[0].axis}/step"] = points[0].step  # one event -> one axis
        self.run.log(data)
        self.points += len(points)

    def close(self) -> None:
        self.run.finish()


def open_wandb(directory: Path, *, project: str = "rollbank", name: str | None = None,
               config: Mapping[str, Any] | None = None) -> WandbSink:
    """A sink logging to a new offline W&B run under ``directory`` (created if needed)."""
    wandb = require("wandb", "wandb", "the W&B sink")
    os.environ["WANDB_MODE"] = "offline"
    directory.mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        mode="offline", dir=str(directory), project=project, name=name,
        config=dict(config or {}), reinit="create_new",
        settings=wandb.Settings(silent=True, console="off", disable_git=True,
                                x_disable_stats=True),
    )
    return WandbSink(run)
