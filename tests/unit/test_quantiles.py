"""The one nearest-rank quantile helper, and its users agreeing on it."""

from __future__ import annotations

import pytest

from rollbank.bench.sandbox import summary as bench_summary
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


def test_bench_summary_uses_the_helper() -> None:
    s = bench_summary([0.001 * i for i in range(1, 101)])
    assert s["p50"] == 50.0 and s["p99"] == 99.0 and s["n"] == 100


def test_bench_summary_of_nothing_is_null_not_nan() -> None:
    s = bench_summary([])
    assert s == {"p50": None, "p99": None, "min": None, "max": None, "n": 0}
