"""Calibration cache: a fresh stored capacity of the same fingerprint replaces the probes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from rollbank.metrics.bound import Capacity
from rollbank.metrics.calibration_cache import (
    CalibrationCache,
    calibrate_or_reuse,
    calibration_cache,
)


def measured(decode: float = 50.0) -> Capacity:
    return Capacity(decode_rate_single=decode, decode_rate_max=2 * decode, prefill_rate_single=900.0,
                    prefill_rate_max=1500.0, sandbox_slots=8, ttft_floor_s=0.02, source="measured",
                    verifier_slots=2)


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t


def run(cache: CalibrationCache | None, fingerprint: str | None, calls: list[int],
        decode: float = 50.0) -> tuple[Capacity, bool]:
    announced: list[int] = []

    async def measure() -> Capacity:
        assert len(announced) == 1  # "calibrating..." is said before measuring, never when reused
        calls.append(1)
        return measured(decode)

    return asyncio.run(calibrate_or_reuse(measure, cache=cache, fingerprint=fingerprint,
                                          sandbox_slots=32, verifier_slots=4,
                                          on_measure=lambda: announced.append(1)))


def test_second_run_reuses_the_stored_capacity_and_says_so(tmp_path: Path) -> None:
    clock = Clock()
    cache = CalibrationCache(tmp_path, max_age_s=3600, now=clock, load=lambda: 1.0)
    calls: list[int] = []
    first, fresh = run(cache, "host A; gemma", calls)
    assert fresh and first.source == "measured" and len(calls) == 1
    clock.t += 600
    second, fresh = run(cache, "host A; gemma", calls, decode=1.0)
    assert not fresh and len(calls) == 1
    assert second.source.startswith("cached:")
    assert second.decode_rate_single == 50.0 and second.decode_rate_max == 100.0
    # slot counts are the current run's configuration, not the stored run's
    assert (second.sandbox_slots, second.verifier_slots) == (32, 4)


def test_other_fingerprint_stale_or_corrupt_file_measures_again(tmp_path: Path) -> None:
    clock = Clock()
    cache = CalibrationCache(tmp_path, max_age_s=3600, now=clock, load=lambda: 1.0)
    calls: list[int] = []
    run(cache, "host A; gemma", calls)
    run(cache, "host B; gemma", calls)
    assert len(calls) == 2
    clock.t += 3601
    _, fresh = run(cache, "host A; gemma", calls)
    assert fresh and len(calls) == 3
    cache.path("host A; gemma").write_text("{not json")
    _, fresh = run(cache, "host A; gemma", calls)
    assert fresh and len(calls) == 4
    assert json.loads(cache.path("host A; gemma").read_text())["fingerprint"] == "host A; gemma"


def test_unknown_fingerprint_or_disabled_cache_always_measures(tmp_path: Path) -> None:
    calls: list[int] = []
    cache = CalibrationCache(tmp_path, max_age_s=3600, load=lambda: 1.0)
    run(cache, None, calls)
    run(cache, None, calls)
    run(None, "host A", calls)
    assert len(calls) == 3 and not list(tmp_path.iterdir())
    assert calibration_cache(0) is None


def test_only_measured_capacities_are_stored(tmp_path: Path) -> None:
    cache = CalibrationCache(tmp_path, max_age_s=3600, load=lambda: 1.0)
    declared = Capacity(decode_rate_single=1.0, decode_rate_max=1.0, prefill_rate_single=1.0,
                        prefill_rate_max=1.0, sandbox_slots=1)
    assert cache.store("x", declared) is None
    assert cache.load("x", sandbox_slots=1, verifier_slots=None) is None


def test_a_calibration_measured_on_a_busier_host_is_measured_again(tmp_path: Path) -> None:
    """Regression: a calibration taken at load ~10 per core was reused on the quiet host; its
    rates understated the servers and the run reported efficiency 3.15 (T_LB/T > 1)."""
    load = [10.0]
    cache = CalibrationCache(tmp_path, max_age_s=3600, now=Clock(), load=lambda: load[0])
    calls: list[int] = []
    run(cache, "host A; gemma", calls, decode=1.0)  # measured while busy
    load[0] = 0.3
    again, fresh = run(cache, "host A; gemma", calls, decode=50.0)  # quiet now: measure again
    assert fresh and len(calls) == 2 and again.decode_rate_single == 50.0
    load[0] = 5.0  # busier than at the last measurement: the stored rates still hold
    reused, fresh = run(cache, "host A; gemma", calls)
    assert not fresh and len(calls) == 2 and reused.decode_rate_single == 50.0
