"""The staleness gate's section of the HTML report: decisions per batch, only when gated."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest

from rollbank.metrics.gate_report import gate_rows, gate_totals
from rollbank.metrics.report import write_report
from rollbank.staleness.config import GateConfig
from rollbank.staleness.estimators import ScoredTokens, batch_divergence, divergence_stats
from rollbank.staleness.gate import GateCounters, GateInput, StalenessGate
from rollbank.staleness.report import staleness_report

needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="needs rollbank[report]")
FRESH = divergence_stats([0.0] * 8)
MILD = divergence_stats([0.2, -0.2] * 4)  # k3 0.0201: down-weight
STALE = divergence_stats([0.4, -0.4] * 4)  # k3 0.0811: drop


def _batch(index: int, config: GateConfig) -> dict[str, Any]:
    """A batch summary row whose staleness report comes from real gate decisions: one group
    with a stale rare success (kept), a mild sibling (down-weighted) and a fresh one
    (admitted); one with a stale failure (retried) and one whose retries are spent (stale_final)."""
    gate = StalenessGate(config)
    g1 = gate.decide_group("g1", [GateInput("g1/s0", 0, True, STALE), GateInput("g1/s1", 1, False, MILD),
                                  GateInput("g1/s2", 2, False, FRESH)])
    g2 = gate.decide_group("g2", [GateInput("g2/s0", 0, False, STALE),
                                  GateInput("g2/s1", 1, False, STALE, stale_retries=2),
                                  GateInput("g2/s2", 2, True, FRESH)])
    counters = GateCounters()
    counters.add_group(g1)
    counters.add_group(g2)
    scored = [ScoredTokens.build("g1/s1", [-1.0, -1.0], [-0.8, -1.2], [1, 1], [0, 0])]
    rep = staleness_report(batch_divergence(scored, current_version=2),
                           [*g1.decisions, *g2.decisions], counters=counters, current_version=2)
    return {"batch_index": index, "n_groups": 2, "staleness": rep}


def test_rows_count_every_decision_of_a_gated_batch() -> None:
    rows = gate_rows([_batch(0, GateConfig()), {"batch_index": 1, "staleness": None}])
    assert len(rows) == 1  # the unmeasured batch has no row
    r = rows[0]
    assert (r["judged"], r["admitted"], r["downweighted"], r["retried"], r["stale_final"]) == (6, 2, 2, 1, 1)
    assert r["rare_success_kept"] == 1
    assert r["groups_with_retry"] == "1/2"
    assert r["k3"] == pytest.approx(math.cosh(0.2) - 1)  # the pooled divergence of the batch
    assert r["ess"] == pytest.approx(math.cosh(0.2) ** 2 / math.cosh(0.4))
    t = gate_totals(rows + rows)
    assert (t["judged"], t["retried"], t["stale_final"]) == (12, 2, 2)
    assert t["k3_max"] == r["k3"] and t["ess_min"] == r["ess"]


def test_a_run_with_the_gate_off_has_no_rows() -> None:
    assert gate_rows([_batch(0, GateConfig(enabled=False))]) == []
    assert gate_rows([{"batch_index": 0}]) == []


@needs_matplotlib
def test_report_shows_the_gate_section_only_when_gated(tmp_path: Path) -> None:
    page = write_report(tmp_path / "on.html", title="t", trajectories=[], events=[],
                        batches=[_batch(0, GateConfig()), _batch(1, GateConfig())]).read_text()
    assert "<h2>Staleness gate per batch</h2>" in page
    assert ("12 attempts judged: 4 admitted, 4 down-weighted, 2 dropped and re-run, "
            "2 dropped for good (stale_final), 2 rare successes kept") in page
    assert "<th title='stale_final'>" in page and "<th title='rare_success_kept'>" in page
    off = write_report(tmp_path / "off.html", title="t", trajectories=[], events=[],
                       batches=[_batch(0, GateConfig(enabled=False))]).read_text()
    assert "Staleness gate" not in off
