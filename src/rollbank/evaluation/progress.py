"""``rollbank eval``'s progress lines: tasks solved, not batches.

An evaluation runs through the collector, whose own progress speaks of training batches and
reward variance; eval turns that view off and prints these plain ``[rollbank] eval`` lines on
stderr instead: each task once all its attempts are in (``k/n solved``, ``tasks d of N``) and a
heartbeat of finished attempts at most every ``heartbeat_s`` seconds.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import TextIO

from rollbank.episodes.outcome import Outcome
from rollbank.scheduling.policy.events import AttemptFinished, Event, EventKind, GroupEvent

PREFIX = "[rollbank] eval:"


class EvalProgress:
    """An event sink printing one line per finished task (and a heartbeat)."""

    def __init__(self, *, label: str, tasks: int, attempts: int, stream: TextIO | None = None,
                 heartbeat_s: float = 30.0, wall: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self.tasks = tasks
        self.attempts = attempts
        self.stream = stream or sys.stderr
        self.heartbeat_s = heartbeat_s
        self._wall = wall
        self._last_beat = wall()
        self._t0: float | None = None
        self.solved: Counter[str] = Counter()  # task -> attempts that succeeded
        self.finished = 0
        self.tasks_done = 0

    def line(self, text: str) -> None:
        self.stream.write(f"{PREFIX} {text}\n")
        self.stream.flush()

    def emit(self, event: Event) -> None:
        if self._t0 is None:
            self._t0 = event.t
        at = f"t={event.t - self._t0:.0f}s"
        if isinstance(event, AttemptFinished):
            self.finished += 1
            if event.outcome.outcome is Outcome.MODEL_SUCCESS:
                self.solved[event.task_id] += 1
            if self._wall() - self._last_beat >= self.heartbeat_s:
                self._last_beat = self._wall()
                self.line(f"{self.label}: attempts finished {self.finished} of "
                          f"{self.tasks * self.attempts} {at}")
        elif isinstance(event, GroupEvent) and event.kind in (EventKind.GROUP_READY,
                                                              EventKind.GROUP_DROPPED):
            self.tasks_done += 1
            self.line(f"{self.label}: task {event.task_id} {self.solved[event.task_id]}/"
                      f"{event.size} solved (tasks {self.tasks_done} of {self.tasks}) {at}")

    def close(self) -> None:
        pass
