"""An instrument: the loop's trainer paced so that a step takes at least ``step_s`` seconds.

On this host the tiny model's optimizer step takes under a second while collecting its batch
takes several, so through the real loop the collector never runs ahead and the policy age of
a trained batch never exceeds 1: async mode's lag and the divergence gate have nothing to
decide. A larger model's trainer is slower than its collection (the regime async training is
for). :class:`PacedTrainer` emulates that: the real step runs, then the call sleeps out the
rest of ``step_s`` (in the trainer's thread: the loop goes on collecting meanwhile). Only the
trainer's wall time is emulated; the update is the real trainer's, unchanged. Used by
``rollbank bench learning --engine vllm --trainer-step-s S``; every figure it gives is labelled
with the pace.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rollbank.api import TensorBatch
from rollbank.training.loop_run import StepTrainer


class PacedTrainer:
    """``inner`` with each :meth:`train` call lasting at least ``step_s`` seconds."""

    def __init__(self, inner: StepTrainer, step_s: float, *,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        if step_s < 0:
            raise ValueError(f"step_s must be >= 0, got {step_s}")
        self.inner, self.step_s = inner, step_s
        self._clock, self._sleep = clock, sleep
        self.paced_s = 0.0  # slept in all, beside the real steps' time

    def train(self, batch: TensorBatch) -> dict[str, float]:
        t0 = self._clock()
        metrics = self.inner.train(batch)
        rest = self.step_s - (self._clock() - t0)
        if rest > 0:
            self._sleep(rest)
            self.paced_s += rest
        return metrics

    def save(self, root: Path, version: int) -> Path:
        return self.inner.save(root, version)

    def tensors(self) -> Mapping[str, Any]:
        return self.inner.tensors()
