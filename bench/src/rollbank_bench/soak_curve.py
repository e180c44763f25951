"""The fault soak's curve and its flatness verdict (pure: no I/O, no clock).

Probes (:func:`rollbank_bench.soak.sample`, every few seconds) are grouped by interval (a
minute by default); each interval keeps, per resource, its *floor* (the minimum over the
interval's probes), its peak and its last reading. Under continuous collection a probe
includes whatever is in flight (sandboxes, their processes and cgroups, open connections),
so the in-flight part comes and goes while a leak raises the floor.

**Flatness (slope criterion)**, judged on two series, each after the first ``warmup`` intervals (minutes by default)
(warm snapshots, pools and caches fill up then):

- the *minute curve*: per interval, the floor of the resources that do not depend on the
  work in flight (RSS, threads, host mounts) -- :data:`MINUTE_ALLOWANCE`. The in-flight
  resources' floors are reported too but not judged there: at full concurrency ~12 sandboxes
  are always in flight, so their floors move by tens between minutes;
- the *drained series*: one reading at the end of each collection round, when nothing is in
  flight (only the engines remain) -- every resource, :data:`DRAINED_ALLOWANCE`; those
  readings are exact (same fds, processes, cgroups every round), so a per-round leak of one
  descriptor, process, cgroup, mount or sandbox shows at once.

For each judged resource of a series: ``trend`` = the least-squares slope of its values over
the series' x (interval index, or intervals elapsed at the round's end) times the series' span (last x
minus first x), the growth the fitted line predicts over the run; ``floor_growth`` = min of
the second half minus min of the first half. A resource is flat when both are at most its
allowance; the soak is flat when every judged resource of both series is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

#: Per-minute floors: resources that do not depend on the work in flight (RSS in MiB).
MINUTE_ALLOWANCE: dict[str, float] = {"threads": 4, "rss_mib": 32, "mounts": 0}
#: Drained readings (a round's end, nothing in flight): every resource. A round's end can
#: catch an engine still being restarted (one process, its pipes) and the executor's threads.
DRAINED_ALLOWANCE: dict[str, float] = {"fds": 2, "threads": 4, "rss_mib": 32, "processes": 1,
                                       "mounts": 0, "cgroups": 0, "sandboxes": 0}
#: Every resource a probe reads.
RESOURCES = tuple(DRAINED_ALLOWANCE)


def interval_record(index: int, probes: Sequence[Mapping[str, float]],
                    keys: Sequence[str] = RESOURCES) -> dict[str, Any]:
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


def judge_series(points: Sequence[tuple[float, Mapping[str, float]]],
                 allowance: Mapping[str, float]) -> dict[str, Any]:
    """Trend and floor growth of each ``allowance`` resource over ``(x, values)`` points."""
    if len(points) < 2:
        return {"points": len(points), "span": 0.0, "per_resource": {}, "flat": False,
                "why_not": "fewer than two judged points"}
    xs = [float(x) for x, _ in points]
    span = xs[-1] - xs[0]
    half = len(points) // 2
    out: dict[str, Any] = {}
    for k, allow in allowance.items():
        ys = [float(v[k]) for _, v in points]
        s = slope(xs, ys)
        growth = min(ys[half:]) - min(ys[:half])
        out[k] = {"slope": round(s, 4), "trend": round(s * span, 2),
                  "floor_growth": round(growth, 2), "allowance": allow,
                  "first": ys[0], "last": ys[-1], "min": min(ys), "max": max(ys),
                  "flat": s * span <= allow and growth <= allow}
    return {"points": len(points), "span": round(span, 2), "per_resource": out,
            "flat": all(v["flat"] for v in out.values())}


def judge_curve(intervals: Sequence[Mapping[str, Any]], drained: Sequence[tuple[float, Mapping[str, float]]],
                warmup: int) -> dict[str, Any]:
    """The verdict (module doc): ``intervals`` from :func:`interval_record`; ``drained`` as
    ``(intervals since the collection started, reading)`` per round end. The first
    ``warmup`` intervals, and the round ends within them, are not judged (unless that leaves
    fewer than two points)."""
    judged = list(intervals[warmup:]) if len(intervals) > warmup + 1 else list(intervals)
    minute = judge_series([(float(r["interval"]), r["floor"]) for r in judged], MINUTE_ALLOWANCE)
    in_flight = judge_series([(float(r["interval"]), r["floor"]) for r in judged],
                             {k: 0.0 for k in RESOURCES if k not in MINUTE_ALLOWANCE})
    minute["in_flight_floors_not_judged"] = {
        k: {n: v for n, v in r.items() if n not in ("allowance", "flat")}
        for k, r in in_flight["per_resource"].items()}
    late = [p for p in drained if p[0] >= warmup]
    d = judge_series(late if len(late) >= 2 else list(drained), DRAINED_ALLOWANCE)
    return {"warmup_minutes": warmup, "minute_curve": minute, "drained": d,
            "flat": minute["flat"] and d["flat"]}
