"""Scalar series from the lifecycle events: what the TensorBoard and W&B sinks log.

:class:`EventScalars` turns each :class:`~rollbank.scheduling.policy.events.Event` into zero or more
:class:`Scalar` points on one of two axes, so every logging backend plots the same series:

- ``attempt`` axis (step = finished attempts so far, from 1): ``attempt/duration_s``,
  ``attempt/model_tokens``, ``attempt/total_tokens``, ``attempt/trainable`` (1 if the outcome
  is model_success or model_failure, else 0) and ``attempt/reward`` (when the verifier gave
  one).
- ``batch`` axis (step = batch index): ``batch/time_to_batch_s``, ``batch/groups``,
  ``batch/trajectories``, ``batch/in_flight``; and, counted since the previous batch,
  ``batch/groups_ready``, ``batch/groups_dropped``, ``batch/groups_zero_variance``,
  ``batch/waste_attempts``, ``batch/waste_sandbox_s``; plus ``batch/accounting/<key>`` for
  every count in the batch's accounting.

Pure and O(1) per event; no I/O.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Literal

from rollbank.scheduling.policy.events import (
    AttemptFinished,
    AttemptWaste,
    BatchEvent,
    Event,
    EventKind,
    GroupEvent,
)

Axis = Literal["attempt", "batch"]
AXES: tuple[Axis, ...] = ("attempt", "batch")


@dataclass(frozen=True)
class Scalar:
    tag: str
    value: float
    step: int
    axis: Axis
    t: float  # collector clock of the event


class EventScalars:
    """Stateful translator: feed every event in order, log what :meth:`of` returns."""

    def __init__(self) -> None:
        self.finished = 0
        self.in_flight = 0
        self._since: Counter[str] = Counter()
        self._waste_s = 0.0

    def of(self, event: Event) -> list[Scalar]:
        kind = event.kind
        if kind is EventKind.LAUNCHED:
            self.in_flight += 1
        elif kind is EventKind.ABORTED:
            self.in_flight -= 1
        elif kind is EventKind.FINISHED and isinstance(event, AttemptFinished):
            self.in_flight -= 1
            self.finished += 1
            return self._attempt(event)
        elif kind is EventKind.WASTE and isinstance(event, AttemptWaste):
            self._since["waste_attempts"] += 1
            self._waste_s += max(event.held_s, 0.0)
        elif isinstance(event, GroupEvent):
            self._since["groups_ready" if kind is EventKind.GROUP_READY else "groups_dropped"] += 1
            if event.zero_variance:
                self._since["groups_zero_variance"] += 1
        elif kind is EventKind.BATCH_READY and isinstance(event, BatchEvent):
            return self._batch(event)
        return []

    def _attempt(self, e: AttemptFinished) -> list[Scalar]:
        values = {
            "duration_s": e.duration_s,
            "model_tokens": float(e.model_tokens),
            "total_tokens": float(e.total_tokens),
            "trainable": 1.0 if e.outcome.outcome.trainable else 0.0,
        }
        if e.outcome.reward is not None:
            values["reward"] = e.outcome.reward
        return [Scalar(f"attempt/{k}", v, self.finished, "attempt", e.t) for k, v in values.items()]

    def _batch(self, e: BatchEvent) -> list[Scalar]:
        values: dict[str, float] = {
            "time_to_batch_s": max(e.t - e.window_start, 0.0),
            "groups": float(e.groups),
            "trajectories": float(e.trajectories),
            "in_flight": float(self.in_flight),
            "waste_sandbox_s": self._waste_s,
        }
        for key in ("groups_ready", "groups_dropped", "groups_zero_variance", "waste_attempts"):
            values[key] = float(self._since[key])
        for key, n in sorted(e.accounting.items()):
            values[f"accounting/{key}"] = float(n)
        self._since.clear()
        self._waste_s = 0.0
        return [Scalar(f"batch/{k}", v, e.batch_index, "batch", e.t) for k, v in values.items()]
