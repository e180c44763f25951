"""The fault soak's curve judge (pure): floors per interval, least-squares trend, verdict."""

from __future__ import annotations

import pytest

from rollbank.bench.soak_curve import ALLOWANCE, interval_record, judge_curve, slope


def _curve(n: int, **per_interval: float) -> list[dict[str, object]]:
    """n intervals flat at 10 except resources growing by ``per_interval`` each interval,
    with in-flight noise on the peaks (floors untouched)."""
    out = []
    for i in range(n):
        probes = [{k: 10.0 + per_interval.get(k, 0.0) * i + extra for k in ALLOWANCE}
                  for extra in (0.0, 7.0, 3.0)]
        out.append(interval_record(i, probes))
    return out


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


def test_flat_curve_with_in_flight_noise_is_flat() -> None:
    out = judge_curve(_curve(30), warmup=2)
    assert out["flat"] and out["judged_intervals"] == 28 and out["span"] == 27
    assert all(r["trend"] == 0 for r in out["per_resource"].values())


def test_a_slow_leak_fails_by_trend() -> None:
    # one process every 5 intervals: 0.2 x 27 = 5.4 > 4
    out = judge_curve(_curve(30, processes=0.2), warmup=2)
    res = out["per_resource"]["processes"]
    assert not out["flat"] and not res["flat"]
    assert res["trend"] == pytest.approx(5.4) and res["slope_per_interval"] == pytest.approx(0.2)
    assert out["per_resource"]["fds"]["flat"]


def test_warmup_growth_is_not_judged() -> None:
    curve = _curve(10)
    curve[0]["floor"] = {k: 0.0 for k in ALLOWANCE}  # pools fill up in the first interval
    assert judge_curve(curve, warmup=1)["flat"]
    assert not judge_curve(curve, warmup=0)["flat"]


def test_a_mount_leak_fails_with_two_intervals() -> None:
    assert not judge_curve(_curve(2, mounts=1.0), warmup=0)["flat"]
    assert judge_curve(_curve(2), warmup=0)["flat"]
    one = judge_curve(_curve(1), warmup=0)
    assert not one["flat"] and one["why_not"]
