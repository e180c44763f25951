"""The fault soak's curve judge (pure): floors per interval, least-squares trend, verdict on
the per-minute floors and on the drained round-end readings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from rollbank_bench.soak_curve import (
    DRAINED_ALLOWANCE,
    MINUTE_ALLOWANCE,
    RESOURCES,
    interval_record,
    judge_curve,
    judge_series,
    slope,
)


def _curve(n: int, **per_interval: float) -> list[dict[str, Any]]:
    """n intervals flat at 10 except resources growing by ``per_interval`` each interval,
    with in-flight noise on the peaks (floors untouched)."""
    return [interval_record(i, [{k: 10.0 + per_interval.get(k, 0.0) * i + extra for k in RESOURCES}
                                for extra in (0.0, 7.0, 3.0)]) for i in range(n)]


def _drained(n: int, **per_round: float) -> list[tuple[float, Mapping[str, float]]]:
    """A round end every 1.5 intervals, exact readings, some resources leaking per round."""
    return [(1.5 * (r + 1), {k: 5.0 + per_round.get(k, 0.0) * r for k in RESOURCES})
            for r in range(n)]


def test_slope_is_least_squares() -> None:
    assert slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert slope([0, 1, 2, 3], [5, 5, 5, 5]) == 0.0
    assert slope([1], [3]) == 0.0 and slope([2, 2], [1, 5]) == 0.0


def test_interval_keeps_floor_peak_last() -> None:
    rec = interval_record(3, [{"fds": 9.0}, {"fds": 4.0}, {"fds": 6.0}], keys=("fds",))
    assert rec["floor"] == {"fds": 4.0} and rec["peak"] == {"fds": 9.0}
    assert rec["last"] == {"fds": 6.0} and rec["interval"] == 3 and rec["probes"] == 3
    with pytest.raises(ValueError):
        interval_record(0, [])


def test_flat_run_with_in_flight_noise_is_flat() -> None:
    out = judge_curve(_curve(30), _drained(20), warmup=2)
    assert out["flat"] and out["minute_curve"]["points"] == 28 and out["minute_curve"]["span"] == 27
    assert set(out["minute_curve"]["per_resource"]) == set(MINUTE_ALLOWANCE)
    assert set(out["drained"]["per_resource"]) == set(DRAINED_ALLOWANCE)
    assert all(r["trend"] == 0 for r in out["drained"]["per_resource"].values())


def test_slow_memory_growth_fails_the_minute_curve() -> None:
    # 1.5 MiB a minute: 1.5 x 27 = 40.5 > 32
    out = judge_curve(_curve(30, rss_mib=1.5), _drained(20), warmup=2)
    res = out["minute_curve"]["per_resource"]["rss_mib"]
    assert not out["flat"] and not res["flat"] and res["trend"] == pytest.approx(40.5)
    assert out["drained"]["flat"] and out["minute_curve"]["per_resource"]["threads"]["flat"]


def test_in_flight_floors_are_reported_not_judged() -> None:
    out = judge_curve(_curve(30, processes=3.0), _drained(20), warmup=2)
    assert out["flat"]  # in-flight floors move with the work; the drained series judges
    assert out["minute_curve"]["in_flight_floors_not_judged"]["processes"]["trend"] == pytest.approx(81.0)


@pytest.mark.parametrize("resource", ["fds", "processes", "cgroups", "mounts", "sandboxes"])
def test_one_leaked_per_round_fails_the_drained_series(resource: str) -> None:
    out = judge_curve(_curve(30), _drained(20, **{resource: 1.0}), warmup=2)
    assert not out["flat"] and not out["drained"]["per_resource"][resource]["flat"]


def test_warmup_is_not_judged() -> None:
    curve, drained = _curve(10), _drained(6)
    curve[0]["floor"] = {k: 0.0 for k in RESOURCES}  # pools fill up in the first interval
    drained[0] = (drained[0][0], {k: 0.0 for k in RESOURCES})  # first round end at 1.5
    assert judge_curve(curve, drained, warmup=2)["flat"]
    assert not judge_curve(curve, drained, warmup=0)["flat"]


def test_fewer_than_two_points_is_not_flat() -> None:
    out = judge_series([(0.0, {"fds": 1.0})], {"fds": 0})
    assert not out["flat"] and out["why_not"]
    assert not judge_curve(_curve(1), _drained(1), warmup=0)["flat"]
