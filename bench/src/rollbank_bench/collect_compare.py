"""How ``rollbank bench collect`` compares arms: one run's arms (:func:`compare_arms`) and,
with ``--repeats N``, interleaved arms that see the same host (:func:`paired_comparison`).

On a shared host, arms run one after the other measure the host's load as much as the levers
(a loaded run once put the optimized arm at 2.29x naive because the load doubled between the
arms). With ``--repeats N`` the arm list runs N times and repeat ``k`` rotates the order by
``k`` (:func:`arm_order`; for two arms: naive, optimized, optimized, naive — an ABBA design,
which cancels a load that drifts linearly over the run). Each arm's ratio is reported against
the naive arm of the *same* repeat (its time neighbour), with the order it ran in and the host
load each arm saw (:class:`HostLoad`: the 1-minute load average and the host's CPU busy share,
sampled while the arm ran), plus the median, geometric mean and pooled ratio over repeats
(:func:`paired_comparison`).

The load sampler reads ``/proc/loadavg`` and ``/proc/stat`` through injected readers (fakes in
unit tests) and sleeps with an injected ``sleep``; nothing here changes an arm's workload.
"""

from __future__ import annotations

import asyncio
import math
import os
import statistics
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

CpuTimes = tuple[float, float]  # (busy jiffies, total jiffies) of the whole host


def arm_order(arms: Sequence[str], repeat: int) -> list[str]:
    """Repeat ``repeat``'s arm order: the list rotated left by ``repeat`` (mod its length), so
    over ``len(arms)`` repeats every arm runs once in every position."""
    if not arms:
        return []
    k = repeat % len(arms)
    return [*arms[k:], *arms[:k]]


def read_cpu_times(path: str = "/proc/stat") -> CpuTimes | None:
    """(busy, total) jiffies of the host's aggregate ``cpu`` line; None where unreadable."""
    try:
        with open(path) as fh:
            first = fh.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    vals = [float(x) for x in first[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)  # idle + iowait
    return sum(vals) - idle, sum(vals)


def read_load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def busy_share(before: CpuTimes | None, after: CpuTimes | None) -> float | None:
    """Share of the host's CPU time that was busy between two readings (all processes)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return round((after[0] - before[0]) / (after[1] - before[1]), 3)


@dataclass
class HostLoad:
    """Samples the host's 1-minute load average every ``interval_s`` while an arm runs
    (``async with``), and its CPU busy share over the whole arm. ``to_dict`` reports the load
    at start and end, its mean and max over the samples, the busy share and the CPU count."""

    interval_s: float = 5.0
    load: Callable[[], float | None] = read_load
    cpu: Callable[[], CpuTimes | None] = read_cpu_times
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
    samples: list[float] = field(default_factory=list)
    _cpu0: CpuTimes | None = field(default=None, init=False)
    _share: float | None = field(default=None, init=False)
    _task: asyncio.Task[None] | None = field(default=None, init=False)

    def _sample(self) -> None:
        v = self.load()
        if v is not None:
            self.samples.append(round(v, 2))

    async def _loop(self) -> None:
        while True:
            await self.sleep(self.interval_s)
            self._sample()

    async def __aenter__(self) -> HostLoad:
        self._cpu0 = self.cpu()
        self._sample()
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._sample()
        self._share = busy_share(self._cpu0, self.cpu())

    def to_dict(self) -> dict[str, Any]:
        s = self.samples
        return {"load_1m_start": s[0] if s else None, "load_1m_end": s[-1] if s else None,
                "load_1m_mean": round(statistics.fmean(s), 2) if s else None,
                "load_1m_max": max(s) if s else None, "samples": len(s),
                "cpu_busy_share": self._share, "cpus": os.cpu_count()}


def _time(arm: dict[str, Any]) -> float | None:
    t = arm.get("time_per_batch_s")
    complete = arm.get("complete_batches") == len(arm.get("batch_times_s", []))
    return float(t) if t and "error" not in arm and complete else None


def paired_comparison(repeats: Sequence[dict[str, Any]],
                      base: str = "naive") -> dict[str, Any]:
    """Each arm against the ``base`` arm of the same repeat (its time neighbour), with the
    repeat's order and both arms' host load; then per arm over repeats: the median and the
    geometric mean of the paired ratios and the pooled ratio (sum of the arm's times / sum of
    the base's over the repeats where both completed). A repeat whose base or arm failed or
    handed over an incomplete batch gives no pair (listed in ``unpaired``)."""
    pairs: list[dict[str, Any]] = []
    unpaired: list[dict[str, Any]] = []
    for rep in repeats:
        arms: dict[str, dict[str, Any]] = rep.get("arms", {})
        order = list(rep.get("order", arms))
        b = _time(arms.get(base, {}))
        for name in order:
            if name == base:
                continue
            t = _time(arms.get(name, {}))
            if b is None or t is None:
                unpaired.append({"repeat": rep.get("repeat"), "arm": name})
                continue
            pairs.append({
                "repeat": rep.get("repeat"), "arm": name, "order": order,
                "ran_before_base": order.index(name) < order.index(base),
                "base_s": round(b, 2), "arm_s": round(t, 2), "ratio": round(t / b, 3),
                "base_load_1m_mean": arms[base].get("host", {}).get("load_1m_mean"),
                "arm_load_1m_mean": arms[name].get("host", {}).get("load_1m_mean"),
                "base_cpu_busy_share": arms[base].get("host", {}).get("cpu_busy_share"),
                "arm_cpu_busy_share": arms[name].get("host", {}).get("cpu_busy_share")})
    summary: dict[str, Any] = {}
    for name in dict.fromkeys(p["arm"] for p in pairs):
        mine = [p for p in pairs if p["arm"] == name]
        ratios = [p["ratio"] for p in mine]
        summary[name] = {
            "pairs": len(mine), "ratio_median": round(statistics.median(ratios), 3),
            "ratio_geomean": round(math.exp(statistics.fmean(math.log(r) for r in ratios)), 3),
            "ratio_pooled": round(sum(p["arm_s"] for p in mine)
                                  / sum(p["base_s"] for p in mine), 3),
            "ratio_min": min(ratios), "ratio_max": max(ratios)}
    return {"base": base, "pairs": pairs, "per_arm": summary, "unpaired": unpaired}


def compare_arms(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Each arm's time per batch against the naive arm's (the arms of one run or repeat)."""
    base = arms.get("naive", {}).get("time_per_batch_s")
    if not base:
        return {"note": "no naive arm result"}
    incomplete = [k for k, a in arms.items()
                  if "error" in a or a.get("complete_batches") != len(a.get("batch_times_s", []))]
    out: dict[str, Any] = {"naive_s": round(base, 2), "arms_with_incomplete_batches": incomplete}
    if incomplete:
        out["warning"] = ("some arm handed over batches with fewer than G groups (groups "
                          "dropped for infra failures): its time is not comparable")
    for name, arm in arms.items():
        t = arm.get("time_per_batch_s")
        if name == "naive" or not t:
            continue
        out[name] = {"time_s": round(t, 2), "ratio_vs_naive": round(t / base, 3),
                     "reduction_pct": round(100 * (1 - t / base), 1),
                     "saved_s": round(base - t, 2)}
    opt = arms.get("optimized", {}).get("time_per_batch_s")
    if opt:
        out["headline_ratio"] = round(opt / base, 3)
        out["headline_reduction_pct"] = round(100 * (1 - opt / base), 1)
        single = {k: base - arms[k]["time_per_batch_s"] for k in ("routing", "sandboxes", "bank")
                  if arms.get(k, {}).get("time_per_batch_s")}
        total = base - opt
        if single and total > 0:
            out["lever_share_of_total_saving"] = {k: round(v / total, 3) for k, v in single.items()}
    return out


SINGLE_LEVER_ARMS = {"sandboxes": "sandboxes", "routing": "routing", "ready_bank": "ready_bank",
                     "overprovision": "overprovision"}


def arm_row(arm: dict[str, Any], naive_s: float | None) -> dict[str, Any]:
    """One arm's headline figures: time per batch, ratio to naive, T_LB/T, waste as a share of
    the attempts launched, mean tail share, inference idle while episodes sat in sandboxes
    (seconds per batch summed over servers), the engines' busy share (mean over batches), and
    the binding lower-bound term per batch."""
    t = _time(arm)
    ledger = arm.get("ledger") or {}
    launched = ledger.get("launched") or 0
    waste = (arm.get("waste") or {}).get("attempts", 0)
    tails = arm.get("tail_share") or []
    idle = arm.get("inference_idle_waiting_env_s") or []
    busy = arm.get("inference_busy_s") or []
    shares = [x for x in arm.get("inference_busy_share") or [] if x is not None]
    terms = arm.get("lower_bound_terms") or []
    return {
        "time_per_batch_s": round(t, 2) if t is not None else None,
        "ratio_vs_naive": round(t / naive_s, 3) if t is not None and naive_s else None,
        "efficiency": round(arm["efficiency"], 3) if arm.get("efficiency") is not None else None,
        "waste_attempts": waste, "launched_attempts": launched,
        "waste_share_of_launched": round(waste / launched, 3) if launched else None,
        "tail_share_mean": round(statistics.fmean(tails), 3) if tails else None,
        "inference_idle_waiting_env_s_per_batch": round(statistics.fmean(idle), 1) if idle else None,
        "inference_busy_s_per_batch": round(statistics.fmean(busy), 1) if busy else None,
        "inference_busy_share_mean": round(statistics.fmean(shares), 3) if shares else None,
        "binding_terms": [x.get("binding_term") for x in terms if isinstance(x, dict)],
    }


def ablation(arms: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The per-lever ablation of one run: every arm's :func:`arm_row` against naive (the mean
    of ``naive`` and ``naive#2`` when both ran, each also listed), each lever added alone
    (its arm / naive) and removed from all (``all_but_X`` / ``optimized``: how much slower all
    levers are without it)."""
    naive = [t for k in ("naive", "naive#2") if (t := _time(arms.get(k, {}))) is not None]
    base = statistics.fmean(naive) if naive else None
    rows = {name: arm_row(a, base) for name, a in arms.items()}
    out: dict[str, Any] = {"naive_s": round(base, 2) if base else None,
                           "naive_runs_s": [round(t, 2) for t in naive], "arms": rows,
                           "table": [{"name": k, **v} for k, v in rows.items()]}
    opt = _time(arms.get("optimized", {}))
    levers: dict[str, Any] = {}
    for lever, single in SINGLE_LEVER_ARMS.items():
        t1 = _time(arms.get(single, {}))
        t0 = _time(arms.get(f"all_but_{lever}", {}))
        levers[lever] = {
            "alone_ratio_vs_naive": round(t1 / base, 3) if t1 is not None and base else None,
            "removed_from_all_ratio_vs_all": round(t0 / opt, 3) if t0 is not None and opt else None}
    out["levers"] = levers
    if opt is not None and base:
        out["all_levers_ratio_vs_naive"] = round(opt / base, 3)
    return out
