"""The launched pool's running statistics for the selection profile (kept by the ledger).

Every valid finished attempt adds its duration, model tokens and reward; every attempt
aborted before it finished adds the time it held its slot (a censored observation). Values
are kept as a sorted prefix plus an unsorted tail, so a batch's profile sorts only what
arrived since the last one (a linear merge), and a run of a million attempts stays linear.

Invariant: each attempt is added at most once (the ledger adds at its single finish or
abort-settlement).
"""

from __future__ import annotations

import math


class _Sorted:
    __slots__ = ("tail", "xs")

    def __init__(self) -> None:
        self.xs: list[float] = []
        self.tail = 0  # xs[:len(xs) - tail] is sorted

    def add(self, x: float) -> None:
        self.xs.append(x)
        self.tail += 1

    def sorted(self) -> list[float]:
        if self.tail:
            self.xs.sort()  # a sorted run and a short tail: timsort merges in linear time
            self.tail = 0
        return self.xs


class Pool:
    """Durations, tokens and rewards of valid finished attempts; censored aborted ones."""

    def __init__(self) -> None:
        self._durations = _Sorted()
        self._tokens = _Sorted()
        self._aborted = _Sorted()
        self.rewards: list[float] = []

    def add_finished(self, duration_s: float, model_tokens: int, reward: float | None) -> None:
        self._durations.add(duration_s)
        self._tokens.add(float(model_tokens))
        if reward is not None:
            self.rewards.append(reward)

    def add_aborted(self, held_s: float) -> None:
        self._aborted.add(held_s)

    def durations(self) -> list[float]:
        """Sorted; do not modify."""
        return self._durations.sorted()

    def tokens(self) -> list[float]:
        return self._tokens.sorted()

    def aborted_held(self) -> list[float]:
        return self._aborted.sorted()

    def reward_mean(self) -> float:
        return math.fsum(self.rewards) / len(self.rewards) if self.rewards else 0.0
