"""The per-batch staleness report in summary.json and on the Prometheus endpoint."""

from __future__ import annotations

import json
import math

from rollbank.metrics.prometheus import PrometheusSink
from rollbank.metrics.summary import staleness_scalars, summarize_batch
from rollbank.staleness.estimators import ScoredTokens, batch_divergence
from rollbank.staleness.report import staleness_report


def report() -> dict[str, object]:
    rows = [
        ScoredTokens.build("a", [0.0, -1.0, -1.0], [0.0, -1.0 + math.log(2.0), -1.0], [0, 1, 1],
                           [-1, 2, 3]),
        ScoredTokens.build("b", [-0.5, 0.0], [-0.6, 0.0], [1, 0], [3, -1]),
    ]
    return staleness_report(batch_divergence(rows, 3), current_version=3, scorer="trainer_recompute")


def test_summary_json_carries_the_staleness_report() -> None:
    rep = report()
    s = summarize_batch(0, [], t_start=0.0, t_end=1.0, seen=[], capacity=None, servers=[],
                        staleness=rep)
    d = json.loads(json.dumps(s.to_dict()))
    tok = d["staleness"]["divergence"]["tokens"]
    for key in ("k1", "k3", "chi2", "ess", "percentiles", "frac_beyond"):
        assert key in tok
    assert d["staleness"]["divergence"]["version_lag_histogram"] == {"0": 2, "1": 1}
    assert tok["frac_beyond"]["0.5"] == 1 / 3  # |log 2| > 0.5, 0 and 0.1 are not
    none = summarize_batch(0, [], t_start=0.0, t_end=1.0, seen=[], capacity=None, servers=[])
    assert none.staleness is None and staleness_scalars(None) == {}
    flat = staleness_scalars(rep)
    assert flat["rollbank_staleness_divergence_tokens_k3"] == tok["k3"]


def test_prometheus_exposes_the_staleness_gauges_and_nans_missing_ones() -> None:
    sink = PrometheusSink()
    rep = report()
    samples = sink.observe_staleness(4, rep)
    text = sink.exposition().decode()
    for name in ("divergence_tokens_k1", "divergence_tokens_k3", "divergence_tokens_chi2",
                 "divergence_tokens_ess", "divergence_tokens_percentiles_p99",
                 "divergence_tokens_frac_beyond_0_1", "divergence_version_lag_histogram_1",
                 "divergence_seq_ess", "gate_admitted"):
        full = f"rollbank_staleness_{name}"
        assert full in samples and f"{full} " in text
    assert "rollbank_staleness_divergence_version_lag_histogram_0 2.0" in text
    assert "rollbank_staleness_batch_index 4.0" in text
    sink.observe_staleness(5, None)  # an unmeasured batch: no stale value shown as current
    text = sink.exposition().decode()
    assert "rollbank_staleness_divergence_tokens_k3 NaN" in text
    assert "rollbank_staleness_batch_index 5.0" in text
