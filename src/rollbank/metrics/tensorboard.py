"""TensorBoard event files for a collection (``pip install 'rollbank[tensorboard]'``).

:class:`TensorBoardSink` is an :class:`~rollbank.scheduling.policy.events.EventSink`: it logs the
scalar series of :mod:`rollbank.metrics.scalars` (``attempt/*`` with the finished-attempt
count as step, ``batch/*`` with the batch index as step) to a :class:`ScalarWriter`.
:func:`open_tensorboard` makes one backed by ``tensorboardX.SummaryWriter`` (the small
writer-only package: no TensorFlow, no torch), writing ``events.out.tfevents.*`` under a log
directory that ``tensorboard --logdir`` reads.

Invariants
- :meth:`TensorBoardSink.emit` only enqueues: tensorboardX writes from its own thread and
  flushes every ``flush_secs`` and at :meth:`TensorBoardSink.close`, so the driver never
  blocks on the file.
- Nothing leaves the machine: event files are local.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from rollbank.extras import require
from rollbank.metrics.scalars import EventScalars
from rollbank.scheduling.policy.events import Event


class ScalarWriter(Protocol):
    """The part of ``tensorboardX.SummaryWriter`` the sink uses."""

    def add_scalar(self, tag: str, scalar_value: float, global_step: int | None = None
                   ) -> object: ...

    def flush(self) -> object: ...

    def close(self) -> object: ...


class TensorBoardSink:
    def __init__(self, writer: ScalarWriter) -> None:
        self.writer = writer
        self.scalars = EventScalars()
        self.points = 0

    def emit(self, event: Event) -> None:
        for s in self.scalars.of(event):
            self.writer.add_scalar(s.tag, s.value, global_step=s.step)
            self.points += 1

    def close(self) -> None:
        self.writer.close()


def open_tensorboard(logdir: Path, *, flush_secs: int = 10) -> TensorBoardSink:
    """A sink writing TensorBoard event files under ``logdir`` (created if needed)."""
    tbx = require("tensorboardX", "tensorboard", "the TensorBoard sink")
    logdir.mkdir(parents=True, exist_ok=True)
    writer: ScalarWriter = tbx.SummaryWriter(logdir=str(logdir), flush_secs=flush_secs)
    return TensorBoardSink(writer)
