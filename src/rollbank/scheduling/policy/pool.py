"""The launched pool's running statistics for the selection profile (kept by the ledger).

Every valid finished attempt adds its duration, model tokens and reward; every attempt
aborted before it finished adds the time it held its slot (a censored observation).

The pool's summaries (n, mean, nearest-rank p50 and p90, max) are kept incrementally, so a
batch's profile costs what arrived since the last one, not the whole pool (a run of a
million attempts stays linear), and they are bit-identical to summarising the full list:

- the mean's sum is ``math.fsum`` of every value, kept as an exact expansion (:class:`ExactSum`:
  a few floats whose exact sum is the values' exact sum; fsum is correctly rounded, so the
  fsum of the expansion is the fsum of the values);
- each quantile is the top of the lower of two heaps holding exactly the nearest rank's
  ``max(1, ceil(q * n))`` smallest values (:class:`RankStat`), the definition of
  :func:`rollbank.quantiles.quantile`.

Invariant: each attempt is added at most once (the ledger adds at its single finish or
abort-settlement).
"""

from __future__ import annotations

import heapq
import math

from rollbank.batching.batch import DistStats

_EMPTY = DistStats(0, 0.0, 0.0, 0.0, 0.0)


class ExactSum:
    """``math.fsum`` of every value added, in time proportional to the values added since the
    last :meth:`total` (the earlier ones are folded into a short exact expansion)."""

    __slots__ = ("parts", "tail")

    def __init__(self) -> None:
        self.parts: list[float] = []  # exact expansion of the values folded so far
        self.tail: list[float] = []  # values not folded yet

    def total(self) -> float:
        if self.tail:
            rest = self.parts + self.tail
            self.tail = []
            s = math.fsum(rest)
            if not math.isfinite(s):  # inf/nan: keep the values themselves
                self.parts = rest
                return s
            parts: list[float] = []
            # the exact sum of doubles is a multiple of 2**-1074: fsum (correctly rounded)
            # is 0.0 exactly when the remainder is 0, so this peels it off in a few steps
            while s != 0.0:
                parts.append(s)
                rest.append(-s)
                s = math.fsum(rest)
            self.parts = parts
        return math.fsum(self.parts)


class RankStat:
    """The nearest-rank ``q``-quantile of a growing multiset: ``low`` (a max-heap, negated)
    holds exactly the ``max(1, ceil(q * n))`` smallest values, ``high`` the rest."""

    __slots__ = ("high", "low", "q")

    def __init__(self, q: float) -> None:
        self.q = q
        self.low: list[float] = []
        self.high: list[float] = []

    def add(self, values: list[float]) -> None:
        low, high, push = self.low, self.high, heapq.heappush
        for x in values:
            if low and x < -low[0]:
                push(low, -x)
            else:
                push(high, x)
        rank = max(1, math.ceil(self.q * (len(low) + len(high))))
        while len(low) < rank:
            push(low, -heapq.heappop(high))
        while len(low) > rank:
            push(high, -heapq.heappop(low))

    def value(self) -> float:
        return -self.low[0]


class RunningDist:
    """n, mean, p50, p90 and max of the values added (:class:`DistStats`), incrementally."""

    __slots__ = ("_max", "_n", "_p50", "_p90", "_sum", "_tail")

    def __init__(self) -> None:
        self._tail: list[float] = []
        self._n = 0
        self._max = -math.inf
        self._sum = ExactSum()
        self._p50 = RankStat(0.5)
        self._p90 = RankStat(0.9)

    def add(self, x: float) -> None:
        self._tail.append(x)

    def stats(self) -> DistStats:
        tail = self._tail
        if tail:
            self._tail = []
            self._n += len(tail)
            self._max = max(self._max, max(tail))
            self._sum.tail.extend(tail)
            self._p50.add(tail)
            self._p90.add(tail)
        if not self._n:
            return _EMPTY
        return DistStats(self._n, self._sum.total() / self._n, self._p50.value() or 0.0,
                         self._p90.value() or 0.0, self._max)


class Pool:
    """Durations, tokens and rewards of valid finished attempts; censored aborted ones."""

    def __init__(self) -> None:
        self._durations = RunningDist()
        self._tokens = RunningDist()
        self._aborted: list[float] = []
        self._aborted_sorted = 0  # _aborted[:_aborted_sorted] is sorted
        self._rewards = ExactSum()
        self._n_rewards = 0

    def add_finished(self, duration_s: float, model_tokens: int, reward: float | None) -> None:
        self._durations.add(duration_s)
        self._tokens.add(float(model_tokens))
        if reward is not None:
            self._rewards.tail.append(reward)
            self._n_rewards += 1

    def add_aborted(self, held_s: float) -> None:
        self._aborted.append(held_s)

    def duration_stats(self) -> DistStats:
        return self._durations.stats()

    def token_stats(self) -> DistStats:
        return self._tokens.stats()

    def aborted_held(self) -> list[float]:
        """Sorted; do not modify."""
        if self._aborted_sorted != len(self._aborted):
            self._aborted.sort()  # a sorted run and a short tail: timsort merges in linear time
            self._aborted_sorted = len(self._aborted)
        return self._aborted

    def reward_mean(self) -> float:
        return self._rewards.total() / self._n_rewards if self._n_rewards else 0.0
