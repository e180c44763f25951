"""A tiny soak on REAL sandboxes (fake inference): samples are taken after every batch and,
once the collection is closed, no process, mount, cgroup or descriptor is left over. The
growth numbers themselves are measured by `rollbank bench soak --json`, not asserted here
beyond what closing must guarantee."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from rollbank_bench.soak import ALLOWANCE, judge, soak

pytestmark = pytest.mark.integration


async def test_soak_smoke_samples_each_batch_and_leaks_nothing(tmp_path: Path) -> None:
    args = argparse.Namespace(batches=3, warmup=1, groups=2, group_size=2,
                              tasks="hello-greeting", out=None)
    report = await soak(args, tmp_path / "run")
    assert report["batches"] == 3 and len(report["samples"]) == 3
    assert all(s["sandboxes"] >= 0 and s["fds"] > 0 for s in report["samples"])
    assert max(s["processes"] for s in report["samples"]) > 0  # control: sandboxes were counted
    leaked = report["leaked_after_close"]
    assert set(leaked) == {"fds", "processes", "mounts", "cgroups"}
    assert all(v <= 0 for v in leaked.values()), leaked
    assert set(report["growth"]) == set(ALLOWANCE)


def test_judge_flags_growth_beyond_the_allowance() -> None:
    flat = [{k: 10.0 for k in ALLOWANCE} for _ in range(4)]
    assert judge(flat, 1)["flat"]
    growing = [dict(s, mounts=10.0 + i) for i, s in enumerate(flat * 2)]
    out = judge(growing, 2)  # judged 12..17: floors 12 (first half) and 15 (second half)
    assert not out["flat"] and out["growth"]["mounts"] == 3.0 and out["judged_samples"] == 6
    noisy = [dict(s, fds=10.0 + 6 * (i % 2)) for i, s in enumerate(flat * 2)]
    assert judge(noisy, 2)["flat"]  # in-flight work at a hand-off is not growth
