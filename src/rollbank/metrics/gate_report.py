"""The staleness gate's decisions per batch, as rows for the HTML report (pure, no I/O).

Input: the batch summaries (:meth:`BatchSummary.to_dict`) of a run; a batch collected with the
gate on carries its staleness report (``staleness``, see :mod:`rollbank.staleness.report`),
whose ``gate`` counters are the window's decisions: admitted, down-weighted, dropped and re-run
(``retried``, like an infra retry), dropped for good (``excluded``: the slot's staleness
retries were spent, waste ``stale_final``) and rare successes kept with a weight. The pooled
divergence of the trained rows gives the k3 / ESS columns. A run without the gate (no batch
with gate decisions, or only ``gate_disabled`` ones) has no rows, and the report shows no
section.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

GATE_COLUMNS = ("batch_index", "judged", "admitted", "downweighted", "retried", "stale_final",
                "rare_success_kept", "groups_with_retry", "weight_mean", "k3", "ess",
                "traj_k3_max", "traj_ess_min", "reasons")

_DISABLED = "gate_disabled"


def _gate_on(report: Mapping[str, Any]) -> bool:
    gate = report.get("gate") or {}
    reasons = set((gate.get("reasons") or {}).keys())
    return int(gate.get("trajectories", 0)) > 0 and bool(reasons - {_DISABLED})


def gate_rows(batches: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per gated batch (``GATE_COLUMNS``); [] when no batch was gated."""
    rows: list[dict[str, Any]] = []
    for b in batches:
        report = b.get("staleness")
        if not report or not _gate_on(report):
            continue
        gate = report["gate"]
        div = report.get("divergence") or {}
        tokens = div.get("tokens") or {}
        rows.append({
            "batch_index": b.get("batch_index"),
            "judged": gate.get("trajectories", 0),
            "admitted": gate.get("admitted", 0),
            "downweighted": gate.get("downweighted", 0),
            "retried": gate.get("retried", 0),
            "stale_final": gate.get("excluded", 0),
            "rare_success_kept": gate.get("rare_success_kept", 0),
            "groups_with_retry": f"{gate.get('groups_with_retry', 0)}/{gate.get('groups', 0)}",
            "weight_mean": report.get("weight_mean"),
            "k3": tokens.get("k3"),
            "ess": tokens.get("ess"),
            "traj_k3_max": div.get("traj_k3_max"),
            "traj_ess_min": div.get("traj_ess_min"),
            "reasons": dict(gate.get("reasons") or {}),
        })
    return rows


def gate_totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The decision counts summed over ``rows`` and the k3 / ESS range across batches."""
    keys = ("judged", "admitted", "downweighted", "retried", "stale_final", "rare_success_kept")
    out: dict[str, Any] = {k: sum(int(r[k]) for r in rows) for k in keys}
    k3 = [float(r["k3"]) for r in rows if r.get("k3") is not None]
    ess = [float(r["ess"]) for r in rows if r.get("ess") is not None]
    out["k3_mean"] = sum(k3) / len(k3) if k3 else None
    out["k3_max"] = max(k3, default=None)
    out["ess_min"] = min(ess, default=None)
    return out
