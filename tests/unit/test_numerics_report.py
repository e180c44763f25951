"""Report math of `rollbank numerics` on hand-made arrays (values computed by hand)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rollbank.numerics.report import (
    ABS_EDGES,
    abs_histogram,
    abs_summary,
    alignment_summary,
    bucket_index,
    bucket_labels,
    compare,
    token_counts,
)
from rollbank.staleness.config import CorrectionConfig
from rollbank.staleness.estimators import DivergenceInputError

# Row 0 scores tokens at t = 1, 2; row 1 at t = 1; everything else is prompt/padding.
REF = np.array([[0.0, -1.0, -2.0, 0.0], [0.0, -0.5, 0.0, 0.0]])
CAND = np.array([[0.0, -1.05, -1.4, 9.0], [0.0, -0.5, 0.0, 0.0]])  # 9.0: unmasked, ignored
MASK = np.array([[0, 1, 1, 0], [0, 1, 0, 0]])
IDS = np.array([[5, 7, 7, 0], [5, 9, 0, 0]])
# delta = cand - ref on the mask: [-0.05, 0.6, 0.0]
K3 = [math.exp(-0.05) - 1 + 0.05, math.exp(0.6) - 1 - 0.6, 0.0]


def test_bucket_labels_and_index() -> None:
    edges = (0, 2, 10, math.inf)
    assert bucket_labels(edges) == ["0-2", "2-10", "10-inf"]
    assert bucket_index([-1, 0, 1.9, 2, 10, 1e9, math.inf], edges).tolist() == [-1, 0, 0, 1, 2, 2, 2]


def test_abs_histogram_counts_per_bin() -> None:
    hist = abs_histogram([0.0, 5e-6, 0.05, 0.6, 0.6, 3.0])
    assert list(hist) == bucket_labels(ABS_EDGES)
    assert hist["0-1e-06"] == 1 and hist["1e-06-1e-05"] == 1 and hist["0.01-0.1"] == 1
    assert hist["0.5-1"] == 2 and hist["1-inf"] == 1
    assert sum(hist.values()) == 6


def test_abs_summary_hand_values() -> None:
    s = abs_summary([-0.05, 0.6, 0.0])
    assert s["n"] == 3
    assert s["mean"] == pytest.approx(0.65 / 3)
    assert s["max"] == pytest.approx(0.6)
    assert s["k3"] == pytest.approx(sum(K3) / 3)
    assert s["share_over"] == {"0.1": pytest.approx(1 / 3), "0.5": pytest.approx(1 / 3)}
    assert s["percentiles"]["p50"] == pytest.approx(0.05)
    empty = abs_summary([])
    assert empty["n"] == 0 and empty["mean"] == 0.0 and empty["share_over"]["0.5"] == 0.0


def test_token_counts_over_masked_tokens_only() -> None:
    counts = token_counts(IDS, MASK)
    assert counts.tolist() == [[0, 2, 2, 0], [0, 1, 0, 0]]


def test_compare_hand_values() -> None:
    r = compare(REF, CAND, MASK, IDS, position_edges=(0, 2, math.inf),
                correction=CorrectionConfig(tis_cap=1.5))
    assert r["abs"]["n"] == 3
    assert r["abs"]["mean"] == pytest.approx(0.65 / 3)
    assert r["abs"]["max"] == pytest.approx(0.6)  # the unmasked 9.0 is ignored
    assert r["abs"]["k3"] == pytest.approx(sum(K3) / 3)
    assert r["divergence"]["k3"] == pytest.approx(sum(K3) / 3)  # same k3 via the estimators
    assert r["divergence"]["mean_log_rho"] == pytest.approx(0.55 / 3)
    assert r["histogram"]["0-1e-06"] == 1 and r["histogram"]["0.01-0.1"] == 1
    assert r["histogram"]["0.5-1"] == 1
    # positions: t=1 twice (|delta| 0.05, 0), t=2 once (0.6)
    assert set(r["by_position"]) == {"0-2", "2-inf"}
    assert r["by_position"]["0-2"]["mean"] == pytest.approx(0.025)
    assert r["by_position"]["2-inf"]["n"] == 1
    assert r["by_position"]["2-inf"]["share_over"]["0.5"] == 1.0
    # frequencies: token 7 occurs twice (deltas -0.05, 0.6), token 9 once (delta 0)
    assert r["by_frequency"]["1-2"] == abs_summary([0.0])
    assert r["by_frequency"]["2-5"]["mean"] == pytest.approx(0.325)
    # sequence ESS of the row weights exp(0.55), exp(0)
    w = np.array([math.exp(0.55), 1.0])
    assert r["seq_ess"] == pytest.approx(w.sum() ** 2 / (2 * (w**2).sum()))
    # token TIS with cap 1.5 truncates exp(0.6) = 1.82: one of three tokens
    assert r["corrections"]["token_tis"]["frac_truncated"] == pytest.approx(1 / 3)
    assert r["corrections"]["token_tis"]["weight_max"] == pytest.approx(1.5)


def test_compare_identical_is_zero() -> None:
    r = compare(REF, REF, MASK, IDS)
    assert r["abs"]["max"] == 0.0 and r["abs"]["k3"] == 0.0
    assert r["histogram"]["0-1e-06"] == 3
    assert r["corrections"]["token_tis"]["frac_truncated"] == 0.0


def test_compare_rejects_bad_input() -> None:
    with pytest.raises(DivergenceInputError):
        compare(REF, CAND[:, :3], MASK, IDS)
    bad = CAND.copy()
    bad[0, 1] = math.nan
    with pytest.raises(DivergenceInputError):
        compare(REF, bad, MASK, IDS)
    with pytest.raises(ValueError):
        compare(REF, CAND, MASK, IDS[:, :3])


def test_alignment_summary() -> None:
    def comp(mean: float, k3: float, truncated: float) -> dict[str, object]:
        return {"abs": {"mean": mean, "k3": k3, "max": 2 * mean, "share_over": {"0.1": 0.0}},
                "corrections": {"token_tis": {"frac_truncated": truncated}}}

    comps = {"base": comp(0.02, 4e-4, 0.01), "same-dtype": comp(0.005, 1e-4, 0.0), "exact": comp(0.0, 0.0, 0.0)}
    s = alignment_summary(comps, "base", ["same-dtype", "exact"])
    assert s["baseline"] == "base" and s["baseline_k3"] == 4e-4
    assert s["aligned"]["same-dtype"]["k3_reduction"] == pytest.approx(4.0)
    assert s["aligned"]["same-dtype"]["mean_abs"] == 0.005
    assert s["aligned"]["exact"]["k3_reduction"] is None
    assert s["aligned"]["exact"]["tis_frac_truncated"] == 0.0
