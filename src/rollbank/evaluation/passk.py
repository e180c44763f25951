"""Pure estimators for evaluation: unbiased pass@k and histogram quantiles.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): with ``n``
attempts of which ``c`` succeeded, the probability that at least one of ``k`` attempts drawn
without replacement succeeds is ``1 - C(n - c, k) / C(n, k)``; averaged over tasks it is an
unbiased estimate of pass@k. pass@1 is then ``c / n``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task with ``n`` attempts and ``c`` successes (needs ``k <= n``)."""
    if not 0 <= c <= n:
        raise ValueError(f"successes {c} not in [0, {n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k = {k} needs 1 <= k <= n = {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mean_pass_at_k(counts: Sequence[tuple[int, int]], k: int) -> float | None:
    """pass@k averaged over tasks ``(n, c)``; tasks with fewer than ``k`` attempts are left
    out; None when none is left."""
    vals = [pass_at_k(n, c, k) for n, c in counts if n >= k]
    return sum(vals) / len(vals) if vals else None


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The ``q``-quantile of a cumulative histogram ``[(upper_bound, count <= bound), ...]``.

    Returns the upper bound of the first bucket whose cumulative count reaches ``q`` of the
    total (a conservative estimate: no interpolation inside a bucket; ``inf`` when the
    quantile lies in the overflow bucket). None for an empty histogram.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    ordered = sorted(buckets)
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = max(1.0, math.ceil(q * total))
    for bound, count in ordered:
        if count >= rank:
            return bound
    return ordered[-1][0]
