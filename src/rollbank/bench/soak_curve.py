"""The fault soak's curve and its flatness verdict (pure: no I/O, no clock).

Probes (:func:`rollbank.bench.soak.sample`, every few seconds) are grouped by interval (a
minute by default); each interval keeps, per resource, its *floor* (the minimum over the
interval's probes), its peak and its last reading. Under continuous collection a probe
includes whatever is in flight (sandboxes, their processes and cgroups, open connections),
so the in-flight part comes and goes while a leak raises the floor.

**Flatness (slope criterion).** Over the judged intervals (the first ``warmup`` are excluded:
warm snapshots, pools and caches fill up then), for each resource:

- ``trend`` = the least-squares slope of the per-interval floors (units per interval) times
  the judged span (last judged interval index minus the first): the growth the fitted line
  predicts over the run;
- ``floor_growth`` = min of the second half's floors minus min of the first half's floors
  (as :func:`rollbank.bench.soak.judge`, on floors);

and the resource is flat when both are at most its allowance. The soak is flat when every
resource is. A leak of ``a`` units per interval over a judged span ``S`` shows as a trend of
about ``a * S``: with a 28-minute span and an allowance of 2 processes, a leak of one process
every ~14 minutes or faster fails it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Allowed growth over the judged span (RSS in MiB), faulted soak at full concurrency. Host
#: mounts and this process's threads do not depend on the work in flight (allowance as the
#: plain soak); processes, cgroups and live sandboxes do (a floor is the lowest in-flight
#: count of an interval), so they get one sandbox's worth (anchor + a command's processes;
#: its cgroup and sub-groups).
ALLOWANCE: dict[str, float] = {"fds": 4, "threads": 4, "rss_mib": 32, "processes": 4,
                               "mounts": 0, "cgroups": 4, "sandboxes": 1}


def interval_record(index: int, probes: Sequence[Mapping[str, float]],
                    keys: Sequence[str] = tuple(ALLOWANCE)) -> dict[str, Any]:
    """One interval of the curve: floor, peak and last reading per resource."""
    if not probes:
        raise ValueError("an interval needs at least one probe")
    return {"interval": index, "t": probes[-1].get("t"), "probes": len(probes),
            "floor": {k: min(p[k] for p in probes) for k in keys},
            "peak": {k: max(p[k] for p in probes) for k in keys},
            "last": {k: probes[-1][k] for k in keys}}


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (0 with fewer than two distinct xs)."""
    n = len(xs)
    if n < 2 or n != len(ys):
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def judge_curve(intervals: Sequence[Mapping[str, Any]], warmup: int,
                allowance: Mapping[str, float] = ALLOWANCE) -> dict[str, Any]:
    """Trend and floor growth per resource over the judged intervals (module doc)."""
    judged = list(intervals[warmup:]) if len(intervals) > warmup + 1 else list(intervals)
    if len(judged) < 2:
        return {"judged_intervals": len(judged), "span": 0, "per_resource": {}, "flat": False,
                "why_not": "fewer than two judged intervals"}
    xs = [float(r["interval"]) for r in judged]
    span = xs[-1] - xs[0]
    half = len(judged) // 2
    out: dict[str, Any] = {}
    for k, allow in allowance.items():
        ys = [float(r["floor"][k]) for r in judged]
        s = slope(xs, ys)
        growth = min(ys[half:]) - min(ys[:half])
        out[k] = {"slope_per_interval": round(s, 4), "trend": round(s * span, 2),
                  "floor_growth": round(growth, 2), "allowance": allow,
                  "floor_first": ys[0], "floor_last": ys[-1],
                  "flat": s * span <= allow and growth <= allow}
    return {"judged_intervals": len(judged), "span": span, "per_resource": out,
            "flat": all(v["flat"] for v in out.values())}
