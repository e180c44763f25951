"""The per-batch staleness summary: one JSON-ready dict for the manifest, summary.json and
Prometheus (the wiring into those sinks is the caller's).

Layout (``STALENESS_REPORT_VERSION`` 1)::

    {"version": 1, "current_version": int | None, "scorer": str,
     "divergence": BatchDivergence.to_dict() | None,     # k1/k3/chi2/ESS/percentiles/...
     "gate": GateCounters.to_dict(),                      # admitted/downweighted/retried/...
     "rare_success": [trajectory_id, ...],                # kept instead of dropped
     "downweighted": [{"trajectory_id", "weight", "reasons"}, ...],
     "dropped": [{"trajectory_id", "verdict", "reasons"}, ...],
     "weight_mean": float,                                # mean gate weight of kept rows
     "correction": CorrectionResult.stats(...) | None}

:func:`prometheus_samples` flattens the numeric scalars to ``rollbank_staleness_*`` names.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rollbank.staleness.estimators import BatchDivergence
from rollbank.staleness.gate import GateCounters, GateDecision, Verdict

STALENESS_REPORT_VERSION = 1


def staleness_report(
    divergence: BatchDivergence | None,
    decisions: Sequence[GateDecision] = (),
    *,
    counters: GateCounters | None = None,
    correction: Mapping[str, Any] | None = None,
    current_version: int | None = None,
    scorer: str = "",
) -> dict[str, Any]:
    """Summary of one batch. ``counters`` defaults to the counts of ``decisions``; pass the
    gate's running counters instead to include the retried attempts that never reached the
    batch. ``scorer`` names where the current-policy log-probs came from (e.g.
    ``"trainer_recompute"`` or ``"engine_prompt_logprobs"``)."""
    if counters is None:
        counters = GateCounters()
        for d in decisions:
            counters.add(d)
    kept = [d for d in decisions if d.keep]
    return {
        "version": STALENESS_REPORT_VERSION,
        "current_version": current_version,
        "scorer": scorer,
        "divergence": divergence.to_dict() if divergence is not None else None,
        "gate": counters.to_dict(),
        "rare_success": [d.trajectory_id for d in decisions if d.rare_success],
        "downweighted": [
            {"trajectory_id": d.trajectory_id, "weight": d.weight,
             "reasons": [r.value for r in d.reasons]}
            for d in decisions if d.verdict is Verdict.DOWNWEIGHT
        ],
        "dropped": [
            {"trajectory_id": d.trajectory_id, "verdict": d.verdict.value,
             "reasons": [r.value for r in d.reasons]}
            for d in decisions if not d.keep
        ],
        "weight_mean": math.fsum(d.weight for d in kept) / len(kept) if kept else 0.0,
        "correction": dict(correction) if correction is not None else None,
    }


_BAD = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_samples(report: Mapping[str, Any], prefix: str = "rollbank_staleness") -> dict[str, float]:
    """Numeric scalars of ``report`` flattened to metric names (lists and strings skipped)."""
    out: dict[str, float] = {}

    def walk(node: Any, name: str) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                walk(v, f"{name}_{_BAD.sub('_', str(k))}")
        elif isinstance(node, int | float):  # bool is an int
            out[name] = float(node)

    walk(report, prefix)
    return out
