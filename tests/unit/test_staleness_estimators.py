"""Divergence estimators against hand-computed values, plus property tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollbank.batching.stats import version_lag_histogram as traj_lag_histogram
from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.staleness.config import EstimatorConfig
from rollbank.staleness.estimators import (
    DivergenceInputError,
    ScoredTokens,
    batch_divergence,
    divergence_stats,
    k3_by_lag,
    k3_terms,
    log_rho,
    normalized_ess,
    scored_rows,
    trajectory_divergence,
    version_lag_histogram,
)

LN2 = math.log(2.0)


def test_log_rho_is_current_minus_behaviour_on_model_tokens_only() -> None:
    lr = log_rho([-9.0, -1.0, -0.5, -2.0], [-1.0, -1.2, -0.5, -1.0], [0, 1, 1, 1])
    np.testing.assert_allclose(lr, [0.0, -0.2, 0.0, 1.0])


def test_log_rho_rejects_shape_mismatch_and_non_finite_model_tokens() -> None:
    with pytest.raises(DivergenceInputError, match="shapes differ"):
        log_rho([0.0, -1.0], [0.0], [0, 1])
    with pytest.raises(DivergenceInputError, match="not finite"):
        log_rho([0.0, -1.0], [0.0, float("nan")], [0, 1])
    with pytest.raises(DivergenceInputError, match="not finite"):
        log_rho([0.0, -math.inf], [0.0, -1.0], [0, 1])
    # a non-finite value on a prompt/env token is ignored (its log-prob means nothing)
    np.testing.assert_allclose(log_rho([-math.inf, -1.0], [0.0, -1.5], [0, 1]), [0.0, -0.5])


def test_stats_of_rho_one_two_half_match_hand_values() -> None:
    # rho = 1, 2, 1/2
    cfg = EstimatorConfig(abs_log_rho_thresholds=(0.1, 0.5, 1.0), percentiles=(0, 25, 50, 100))
    s = divergence_stats([0.0, LN2, -LN2], cfg)
    assert s.n_tokens == 3
    assert s.mean_log_rho == pytest.approx(0.0, abs=1e-15)
    assert s.geo_ratio == pytest.approx(1.0)
    assert s.k1 == pytest.approx(0.0, abs=1e-15)
    assert s.k2 == pytest.approx(LN2**2 / 3)
    # k3 terms: 0, 2 - 1 - ln2, 1/2 - 1 + ln2 -> sum 1/2
    assert s.k3_sum == pytest.approx(0.5)
    assert s.k3 == pytest.approx(1 / 6)
    assert s.chi2 == pytest.approx((1 + 4 + 0.25) / 3 - 1)  # 0.75
    assert s.tv == pytest.approx(0.5 * (0 + 1 + 0.5) / 3)  # 0.25
    assert s.ess == pytest.approx(3.5**2 / (3 * 5.25))  # 7/9
    assert s.max_abs_log_rho == pytest.approx(LN2)
    assert s.percentiles == pytest.approx({"p0": -LN2, "p25": -LN2 / 2, "p50": 0.0, "p100": LN2})
    assert s.frac_beyond == pytest.approx({"0.1": 2 / 3, "0.5": 2 / 3, "1": 0.0})


def test_stats_of_a_uniform_shift() -> None:
    s = divergence_stats([-0.1] * 4)
    assert s.k1 == pytest.approx(0.1)
    assert s.k3 == pytest.approx(math.exp(-0.1) - 1 + 0.1)
    assert s.k3_sum == pytest.approx(4 * (math.exp(-0.1) - 1 + 0.1))
    assert s.geo_ratio == pytest.approx(math.exp(-0.1))
    assert s.ess == pytest.approx(1.0)  # equal weights: ESS blind to a shift
    assert s.chi2 == pytest.approx(math.exp(-0.2) - 1)  # a sample estimate may be < 0
    assert s.frac_beyond == {"0.1": 0.0, "0.5": 0.0}  # strictly beyond


def test_empty_token_set_convention() -> None:
    s = divergence_stats([])
    assert (s.n_tokens, s.k1, s.k3, s.chi2, s.ess, s.geo_ratio) == (0, 0.0, 0.0, 0.0, 1.0, 1.0)
    assert set(s.percentiles) == {"p1", "p5", "p25", "p50", "p75", "p95", "p99"}
    assert s.frac_beyond == {"0.1": 0.0, "0.5": 0.0}


def test_k3_is_accurate_for_tiny_log_rho() -> None:
    # exp(x) - 1 - x cancels catastrophically at 1e-9; expm1(x) - x ~ x^2 / 2
    x = 1e-9
    assert k3_terms([x])[0] == pytest.approx(x * x / 2, rel=1e-6, abs=0.0)
    assert k3_terms([-x])[0] == pytest.approx(x * x / 2, rel=1e-6, abs=0.0)


def test_overflowing_ratio_is_reported_as_inf_not_hidden() -> None:
    s = divergence_stats([800.0, 0.0])
    assert math.isinf(s.k3) and math.isinf(s.chi2)
    assert s.ess == pytest.approx(0.5)  # log-space ESS stays finite


def test_normalized_ess_hand_values_and_stability() -> None:
    assert normalized_ess([]) == 1.0
    assert normalized_ess([0.3, 0.3, 0.3]) == pytest.approx(1.0)
    assert normalized_ess([0.0, LN2]) == pytest.approx(9 / 10)  # (1+2)^2 / (2 * 5)
    assert normalized_ess([1000.0, 1000.0]) == pytest.approx(1.0)
    assert normalized_ess([1000.0, 0.0]) == pytest.approx(0.5)
    with pytest.raises(DivergenceInputError):
        normalized_ess([0.0, -math.inf])


def _traj(tid: str, model: list[tuple[list[float], list[int]]]) -> Trajectory:
    t = Trajectory(trajectory_id=tid, group_id="g", task_id="t", attempt=0)
    t.append_prompt([1, 2])
    t.prompt_len = 2
    for lps, versions in model:
        t.append_model([5] * len(lps), lps, versions)
        t.append_prompt([9])
    t.outcome = EpisodeOutcome.of(Reason.VERIFIED_PASS, reward=1.0)
    return t


def test_scored_tokens_from_trajectory_lags_and_histograms() -> None:
    t = _traj("a", [([-1.0, -0.5], [3, 3]), ([-2.0], [5])])
    # tokens: p p m m e m e ; current log-probs for every token
    current = [0.0, 0.0, -1.0 + LN2, -0.5 - LN2, 0.0, -2.0, 0.0]
    s = ScoredTokens.from_trajectory(t, current)
    np.testing.assert_allclose(s.log_rho(), [LN2, -LN2, 0.0])
    assert version_lag_histogram([s], 5) == {0: 1, 2: 2}
    assert version_lag_histogram([s], 5) == traj_lag_histogram([t], 5)
    lag = k3_by_lag([s], 5)
    assert lag[0] == 0.0
    assert lag[2] == pytest.approx(0.5 / 2)  # (1 - ln2) + (ln2 - 1/2) over 2 tokens
    d = trajectory_divergence(s)
    assert d.n_tokens == 3 and d.k3_sum == pytest.approx(0.5)


def test_scored_tokens_rejects_misaligned_arrays() -> None:
    t = _traj("a", [([-1.0], [0])])
    with pytest.raises(DivergenceInputError, match="equal length"):
        ScoredTokens.from_trajectory(t, [0.0, 0.0])
    with pytest.raises(DivergenceInputError, match="not finite"):
        ScoredTokens.from_trajectory(t, [0.0, 0.0, float("nan"), 0.0])


def test_batch_divergence_pools_tokens_and_weights_sequences() -> None:
    a = ScoredTokens.build("a", [-1.0, -1.0], [-1.0 + LN2, -1.0], [1, 1], [4, 4])
    b = ScoredTokens.build("b", [-1.0, -1.0, 0.0], [-1.0 - LN2, -1.0, 0.0], [1, 1, 0], [5, 5, -1])
    empty = ScoredTokens.build("c", [0.0], [0.0], [0], [-1])
    bd = batch_divergence([a, b, empty], current_version=5)
    assert bd.trajectories == 3
    assert bd.tokens.n_tokens == 4
    assert bd.tokens.k3_sum == pytest.approx(0.5)  # pooled (ln2, 0, -ln2, 0)
    # sequence weights prod rho: 2 and 1/2 -> ESS (2.5)^2 / (2 * 4.25)
    assert bd.seq_ess == pytest.approx(2.5**2 / (2 * 4.25))
    k3a, k3b = (1 - LN2) / 2, (LN2 - 0.5) / 2
    assert bd.traj_k3_mean == pytest.approx((k3a + k3b) / 2)  # the empty row is not measured
    assert bd.traj_k3_max == pytest.approx(k3a)
    assert bd.traj_k3_sum_mean == pytest.approx(0.25)
    assert bd.version_lag_histogram == {0: 2, 1: 2}
    assert bd.k3_by_lag == pytest.approx({0: k3b, 1: k3a})
    assert set(bd.per_trajectory) == {"a", "b", "c"}
    d = bd.to_dict(per_trajectory=True)
    assert d["version_lag_histogram"] == {"0": 2, "1": 2}
    assert d["per_trajectory"]["c"]["n_tokens"] == 0
    with pytest.raises(DivergenceInputError, match="unique"):
        batch_divergence([a, a], 5)


def test_scored_rows_of_padded_arrays_match_per_row_building() -> None:
    mu = np.array([[-1.0, -1.0, 0.0], [-1.0, 0.0, 0.0]])
    pi = np.array([[-1.0 + LN2, -1.0, 0.0], [-1.0 - LN2, 0.0, 0.0]])
    mask = np.array([[1, 1, 0], [1, 0, 0]])
    ver = np.array([[4, 4, -1], [5, -1, -1]])
    rows = scored_rows(["a", "b"], mu, pi, mask, ver)
    assert [r.trajectory_id for r in rows] == ["a", "b"]
    np.testing.assert_allclose(rows[0].log_rho(), [LN2, 0.0])
    np.testing.assert_allclose(rows[1].log_rho(), [-LN2])
    assert version_lag_histogram(rows, 5) == {0: 1, 1: 2}
    with pytest.raises(DivergenceInputError, match="ids"):
        scored_rows(["a"], mu, pi, mask, ver)


def test_estimator_config_is_validated() -> None:
    with pytest.raises(ValueError):
        EstimatorConfig(abs_log_rho_thresholds=(0.0,))
    with pytest.raises(ValueError):
        EstimatorConfig(percentiles=(101.0,))


# ---------------------------------------------------------------- properties
log_rhos = st.lists(
    st.floats(min_value=-30.0, max_value=30.0, allow_nan=False), min_size=1, max_size=64
)


@settings(max_examples=200, deadline=None)
@given(log_rhos)
def test_property_k3_nonnegative_and_ess_in_unit_interval(xs: list[float]) -> None:
    s = divergence_stats(xs)
    assert (k3_terms(xs) >= 0).all()
    assert s.k3 >= 0 and s.k3_sum >= 0
    assert 0.0 < s.ess <= 1.0
    assert s.tv >= 0 and s.k2 >= 0
    assert s.k1 == pytest.approx(-s.mean_log_rho)
    assert 0.0 <= s.frac_beyond["0.5"] <= s.frac_beyond["0.1"] <= 1.0
    assert s.percentiles["p1"] <= s.percentiles["p50"] <= s.percentiles["p99"]


@settings(max_examples=200, deadline=None)
@given(log_rhos, st.floats(min_value=-500.0, max_value=500.0))
def test_property_ess_is_invariant_to_scaling_all_weights(xs: list[float], c: float) -> None:
    assert normalized_ess([x + c for x in xs]) == pytest.approx(normalized_ess(xs), rel=1e-9)


@settings(max_examples=100, deadline=None)
@given(st.floats(min_value=-30.0, max_value=30.0), st.integers(min_value=1, max_value=50))
def test_property_equal_ratios_have_full_ess(x: float, n: int) -> None:
    assert divergence_stats([x] * n).ess == pytest.approx(1.0)
