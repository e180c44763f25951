"""The one nearest-rank quantile helper (its benchmark users: bench/tests/unit/test_bench_timing.py)."""

from __future__ import annotations

import pytest

from rollbank.quantiles import quantile, quantiles


def test_nearest_rank_is_always_a_sample() -> None:
    xs = [10, 1, 9, 2, 8, 3, 7, 4, 6, 5]
    assert quantile(xs, 0.9) == 9
    assert quantile(xs, 0.5) == 5
    assert quantile(xs, 0.0) == 1
    assert quantile(xs, 1.0) == 10
    assert quantile([3.5], 0.99) == 3.5
    assert quantiles(xs, [0.1, 0.95]) == [1, 10]


def test_empty_input_has_no_quantile() -> None:
    assert quantile([], 0.5) is None
    assert quantiles([], [0.5, 0.9]) == [None, None]


def test_q_outside_unit_interval_is_an_error() -> None:
    with pytest.raises(ValueError):
        quantile([1.0], 50)  # a percent where a fraction is meant


def test_numpy_inverted_cdf_is_the_nearest_rank_formula() -> None:
    import math
    import random

    rng = random.Random(7)
    for n in (1, 2, 3, 10, 101):
        xs = [rng.uniform(-5, 5) for _ in range(n)]
        for q in (0.0, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 1.0):
            assert quantile(xs, q) == sorted(xs)[max(0, math.ceil(q * n) - 1)]


def test_interpolated_is_numpys_linear_percentile() -> None:
    from rollbank.quantiles import interpolated

    assert interpolated([0.0, 1.0, 2.0, 3.0], [0, 25, 50, 100]) == [0.0, 0.75, 1.5, 3.0]
