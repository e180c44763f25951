"""A benchmark's timing samples summarised: p50/p99/min/max in milliseconds (nearest rank).

Shared by ``bench sandbox`` (local and ``--ray``) and ``bench schedule --decision-cost``.
"""

from __future__ import annotations

from typing import Any

from rollbank.quantiles import quantile


def summary(values_s: list[float]) -> dict[str, Any]:
    """p50/p99/min/max in ms (nearest rank, :mod:`rollbank.quantiles`); ``None`` if no samples."""
    ms = [v * 1000 for v in values_s]

    def r(x: float | None) -> float | None:
        return None if x is None else round(x, 2)

    return {"p50": r(quantile(ms, 0.50)), "p99": r(quantile(ms, 0.99)),
            "min": r(min(ms, default=None)), "max": r(max(ms, default=None)), "n": len(ms)}
