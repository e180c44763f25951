"""Injected time.

Pure policies (router, scheduler, ready bank, later the staleness gate) never read the wall
clock themselves: they receive a :class:`Clock` and ask it. Real drivers pass
:class:`MonotonicClock`; unit tests and the future virtual-time simulator pass
:class:`FakeClock` and move time explicitly.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """A source of seconds on a monotonic time line (origin is arbitrary)."""

    def now(self) -> float: ...


class MonotonicClock:
    """The real clock: ``time.monotonic()``."""

    def now(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that only moves when told to. Deterministic timeouts in tests and simulation."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"FakeClock cannot go backwards (advance({seconds}))")
        self._t += seconds
        return self._t

    def set(self, t: float) -> None:
        if t < self._t:
            raise ValueError(f"FakeClock cannot go backwards ({self._t} -> {t})")
        self._t = t
