"""A benchmark's timing summary agrees with rollbank's one nearest-rank quantile."""

from __future__ import annotations

from rollbank_bench.timing import summary as bench_summary


def test_bench_summary_uses_the_helper() -> None:
    s = bench_summary([0.001 * i for i in range(1, 101)])
    assert s["p50"] == 50.0 and s["p99"] == 99.0 and s["n"] == 100


def test_bench_summary_of_nothing_is_null_not_nan() -> None:
    s = bench_summary([])
    assert s == {"p50": None, "p99": None, "min": None, "max": None, "n": 0}
