"""bench collect --repeats: rotated arm order, pairing with the same repeat's naive arm, host load."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

import pytest

from rollbank_bench.collect import add_arguments, arm_config
from rollbank_bench.collect_compare import (
    HostLoad,
    arm_order,
    busy_share,
    paired_comparison,
    read_cpu_times,
)


def _arm(t: float, load: float | None = None, complete: int = 2) -> dict[str, Any]:
    return {"time_per_batch_s": t, "batch_times_s": [t, t], "complete_batches": complete,
            "host": {"load_1m_mean": load, "cpu_busy_share": None}}


def test_two_arms_over_two_repeats_run_abba_and_every_arm_takes_every_position() -> None:
    arms = ["naive", "optimized"]
    assert [arm_order(arms, k) for k in range(2)] == [["naive", "optimized"],
                                                      ["optimized", "naive"]]
    five = ["a", "b", "c", "d", "e"]
    orders = [arm_order(five, k) for k in range(5)]
    for pos in range(5):
        assert sorted(o[pos] for o in orders) == five
    assert arm_order(five, 7) == arm_order(five, 2) and arm_order([], 3) == []


def test_each_arm_is_paired_with_its_own_repeats_naive_not_a_pooled_one() -> None:
    # repeat 0 ran while the host was quiet, repeat 1 while it was loaded: the pairs are
    # 40/100 and 90/200; pairing across repeats would give 90/100 or 40/200
    reps = [{"repeat": 0, "order": ["naive", "optimized"],
             "arms": {"naive": _arm(100.0, 1.0), "optimized": _arm(40.0, 1.5)}},
            {"repeat": 1, "order": ["optimized", "naive"],
             "arms": {"optimized": _arm(90.0, 20.0), "naive": _arm(200.0, 22.0)}}]
    out = paired_comparison(reps)
    assert [(p["repeat"], p["ratio"], p["ran_before_base"]) for p in out["pairs"]] == [
        (0, 0.4, False), (1, 0.45, True)]
    assert (out["pairs"][1]["base_load_1m_mean"], out["pairs"][1]["arm_load_1m_mean"]) == (22.0,
                                                                                           20.0)
    s = out["per_arm"]["optimized"]
    assert s["pairs"] == 2 and s["ratio_median"] == pytest.approx(0.425)
    assert s["ratio_geomean"] == pytest.approx((0.4 * 0.45) ** 0.5, abs=1e-3)
    assert s["ratio_pooled"] == pytest.approx(130.0 / 300.0, abs=1e-3)
    assert out["unpaired"] == []


def test_a_failed_or_incomplete_arm_gives_no_pair() -> None:
    reps = [{"repeat": 0, "order": ["naive", "optimized"],
             "arms": {"naive": _arm(100.0), "optimized": {"error": "boom"}}},
            {"repeat": 1, "order": ["optimized", "naive"],
             "arms": {"optimized": _arm(30.0), "naive": _arm(100.0, complete=1)}},
            {"repeat": 2, "order": ["naive", "optimized"],
             "arms": {"naive": _arm(100.0), "optimized": _arm(50.0)}}]
    out = paired_comparison(reps)
    assert [p["repeat"] for p in out["pairs"]] == [2]
    assert out["unpaired"] == [{"repeat": 0, "arm": "optimized"},
                               {"repeat": 1, "arm": "optimized"}]


def test_busy_share_and_proc_stat_parsing(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal
    stat.write_text("cpu  100 0 50 800 50 0 0 0\ncpu0 1 2 3 4\n")
    assert read_cpu_times(str(stat)) == (150.0, 1000.0)
    assert busy_share((150.0, 1000.0), (450.0, 1400.0)) == 0.75
    assert busy_share(None, (1.0, 2.0)) is None and busy_share((1.0, 2.0), (1.0, 2.0)) is None
    assert read_cpu_times(str(tmp_path / "missing")) is None


def test_host_load_samples_while_the_arm_runs_and_reports_the_cpu_share() -> None:
    loads = iter([1.0, 3.0, 5.0, 7.0, 9.0])
    cpus = iter([(0.0, 100.0), (50.0, 200.0)])
    ticks: asyncio.Queue[None] = asyncio.Queue()

    async def fake_sleep(_: float) -> None:
        await ticks.get()  # one sample per tick the test gives

    async def body() -> HostLoad:
        async with HostLoad(load=lambda: next(loads), cpu=lambda: next(cpus),
                            sleep=fake_sleep) as h:
            for _ in range(2):
                ticks.put_nowait(None)
                await asyncio.sleep(0)
                await asyncio.sleep(0)
        return h

    d = asyncio.run(body()).to_dict()
    assert (d["load_1m_start"], d["load_1m_end"], d["samples"]) == (1.0, 7.0, 4)
    assert (d["load_1m_mean"], d["load_1m_max"], d["cpu_busy_share"]) == (4.0, 7.0, 0.5)


def test_each_repeat_writes_to_its_own_output_folder(tmp_path: Path) -> None:
    p = argparse.ArgumentParser()
    add_arguments(p)
    a = p.parse_args(["--out", str(tmp_path), "--repeats", "2"])
    assert a.repeats == 2
    assert arm_config(a, "naive").output == str(tmp_path / "naive")
    c = arm_config(a, "naive", output=tmp_path / "repeat1" / "naive")
    assert c.output == str(tmp_path / "repeat1" / "naive")
