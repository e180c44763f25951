"""Quantiles: the one nearest-rank definition every rollbank statistic uses, on numpy.

Bottom layer (no rollbank imports), so ``scheduling``, ``metrics``, ``numerics`` and the
benchmarks can all use it.

Definition: for ``n`` samples sorted ascending, ``quantile(xs, q)`` is the sample of rank
``max(1, ceil(q * n))`` (1-based) -- the smallest sample that at least a fraction ``q`` of
the samples do not exceed: numpy's ``method="inverted_cdf"``. It is always one of the samples
(no interpolation), so a p90 of episode finish times is the finish time of a real episode.
The incremental pool statistics (``scheduling/policy/pool.py``) keep exactly this rank
(``tests/unit/test_scheduling_pool_stats.py``).

Empty input has no quantile: the result is ``None``. Callers that need a number choose
their own stand-in at the call site, where its meaning is visible.

One exception, named here so it is not a second hidden definition: the staleness report's
log-rho percentiles are linearly interpolated (:func:`interpolated`, numpy's default
``"linear"``), as its config documents and its tests pin.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np


def _array(values: Iterable[float]) -> np.ndarray[tuple[int], np.dtype[np.float64]]:
    if isinstance(values, np.ndarray):
        return np.asarray(values, dtype=np.float64).ravel()
    return np.fromiter(values, dtype=np.float64)


def _check(qs: Sequence[float]) -> None:
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q must be in [0, 1], got {q}")


def quantiles(values: Iterable[float], qs: Iterable[float]) -> list[float | None]:
    """Nearest-rank quantiles of the same samples (``q`` in [0, 1]); ``None`` each if empty."""
    qs = list(qs)
    _check(qs)
    xs = _array(values)
    if xs.size == 0:
        return [None] * len(qs)
    return [float(v) for v in np.quantile(xs, qs, method="inverted_cdf")]


def quantile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank ``q``-quantile of ``values`` (``q`` in [0, 1]); ``None`` if empty."""
    return quantiles(values, [q])[0]


def interpolated(values: Iterable[float], percents: Sequence[float]) -> list[float]:
    """Linearly interpolated percentiles (``percents`` in [0, 100]) of non-empty ``values``:
    the staleness report's definition only (see the module docstring)."""
    return [float(v) for v in np.percentile(_array(values), percents)]
