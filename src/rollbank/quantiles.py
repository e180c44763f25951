"""Nearest-rank quantiles: the one definition every rollbank statistic uses.

Bottom layer (no rollbank imports), so ``scheduling``, ``metrics`` and ``bench`` can all use
it.

Definition: for ``n`` samples sorted ascending, ``quantile(xs, q)`` is the sample of rank
``max(1, ceil(q * n))`` (1-based) -- the smallest sample that at least a fraction ``q`` of
the samples do not exceed. It is always one of the samples (no interpolation), so a p90 of
episode finish times is the finish time of a real episode.

Empty input has no quantile: the result is ``None``. Callers that need a number choose
their own stand-in at the call site, where its meaning is visible.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def quantile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank ``q``-quantile of ``values`` (``q`` in [0, 1]); ``None`` if empty."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be in [0, 1], got {q}")
    xs = sorted(values)
    if not xs:
        return None
    return xs[max(0, math.ceil(q * len(xs)) - 1)]


def quantiles(values: Iterable[float], qs: Iterable[float]) -> list[float | None]:
    """Several quantiles of the same samples (sorted once)."""
    xs = sorted(values)
    return [quantile(xs, q) for q in qs]
