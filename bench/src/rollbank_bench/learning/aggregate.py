"""Across seeds: per arm mean ± standard error of the eval curve and of final / mean eval.

Every arm of one seed sees the same prompts in the same order and is evaluated on the same
fixed task set at the same sample counts, so the arms can be compared per sample and, within
a seed, paired. For each arm name (``sync``, ``gated``, ...) over the seeds that ran it:

- ``curve``: per eval point (same ``samples`` in every seed) the mean solve rate and its
  standard error across seeds (sample standard deviation / sqrt(n); None for one seed);
- ``final`` / ``auc``: the same for the last eval point and the mean over eval points after
  step 0 (:func:`rollbank_bench.learning.report.auc`);
- ``gap_vs_sync``: ``(mean auc - mean sync auc) / mean sync auc`` over the seeds both ran, and
  the paired per-seed gaps with their mean ± standard error.

The verdict: the gated arm is within 5 % of sync when the gap of the means is >= -5 %; it is
*decided* when the paired mean gap ± 2 standard errors lies entirely on one side of -5 %.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rollbank_bench.learning.report import TOLERANCE, auc


def mean_se(xs: Sequence[float]) -> dict[str, Any]:
    """Mean, standard error of the mean (None for fewer than two values) and n."""
    n = len(xs)
    if n == 0:
        return {"mean": None, "se": None, "n": 0}
    m = math.fsum(xs) / n
    se = math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (n - 1) / n) if n > 1 else None
    return {"mean": m, "se": se, "n": n}


def _by_name(arms: Sequence[dict[str, Any]]) -> dict[str, dict[Any, dict[str, Any]]]:
    out: dict[str, dict[Any, dict[str, Any]]] = {}
    for a in arms:
        out.setdefault(a["arm"], {})[a.get("seed")] = a
    return out


def _curve(by_seed: dict[Any, dict[str, Any]]) -> list[dict[str, Any]]:
    points: dict[int, list[float]] = {}
    for a in by_seed.values():
        for e in a["evals"]:
            points.setdefault(int(e.get("samples", 0)), []).append(float(e["solve_rate"]))
    return [{"samples": s} | mean_se(v) for s, v in sorted(points.items())]


def aggregate(arms: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per arm name: seeds, curve, final, auc and (not for sync) the gap to sync."""
    named = _by_name(arms)
    sync = named.get("sync", {})
    out: dict[str, Any] = {"tolerance": TOLERANCE, "arms": {}}
    for name, by_seed in named.items():
        seeds = sorted(by_seed, key=str)
        aucs = {s: auc(by_seed[s]) for s in seeds}
        entry: dict[str, Any] = {
            "seeds": seeds,
            "lag": next(iter(by_seed.values()))["lag"],
            "final": mean_se([float(by_seed[s]["evals"][-1]["solve_rate"]) for s in seeds]),
            "auc": mean_se(list(aucs.values())),
            "start": mean_se([float(by_seed[s]["evals"][0]["solve_rate"]) for s in seeds]),
            "curve": _curve(by_seed),
        }
        if name != "sync":
            entry["gap_vs_sync"] = _gap(aucs, {s: auc(a) for s, a in sync.items()})
        out["arms"][name] = entry
    gated = out["arms"].get("gated", {}).get("gap_vs_sync")
    out["gated_verdict"] = _verdict(gated) if gated else None
    return out


def _gap(arm: dict[Any, float], sync: dict[Any, float]) -> dict[str, Any] | None:
    common = [s for s in arm if s in sync]
    if not common:
        return None
    m_arm = math.fsum(arm[s] for s in common) / len(common)
    m_sync = math.fsum(sync[s] for s in common) / len(common)
    per_seed = {str(s): (arm[s] - sync[s]) / sync[s] for s in common if sync[s] > 0}
    return {"seeds": common,
            "gap_of_means": (m_arm - m_sync) / m_sync if m_sync > 0 else None,
            "paired": mean_se(list(per_seed.values())), "per_seed": per_seed}


def _verdict(gap: dict[str, Any]) -> dict[str, Any]:
    g = gap.get("gap_of_means")
    p = gap["paired"]
    decided = None
    if p["mean"] is not None and p["se"] is not None:
        lo, hi = p["mean"] - 2 * p["se"], p["mean"] + 2 * p["se"]
        decided = "within" if lo >= -TOLERANCE else "outside" if hi < -TOLERANCE else "undecided"
    return {"within_5pct": g is not None and g >= -TOLERANCE, "gap_of_means": g,
            "paired_mean_2se": decided}
