"""Importance corrections against hand-computed values, plus property tests."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from rollbank.staleness.config import CorrectionConfig, CorrectionMode
from rollbank.staleness.corrections import (
    apply_correction,
    geometric_rs_keep,
    icepop,
    k3_rs_keep,
    m2po,
    m2po_keep,
    no_correction,
    seq_mis,
    seq_tis,
    sequence_log_rho,
    token_tis,
)
from rollbank.staleness.estimators import DivergenceInputError

L = math.log


def test_token_tis_truncates_at_cap_and_zeroes_non_model_tokens() -> None:
    r = token_tis([L(3), L(0.5), 7.0, L(1.5)], [1, 1, 0, 1], cap=2.0)
    np.testing.assert_allclose(r.weights, [2.0, 0.5, 0.0, 1.5])
    assert r.keep.tolist() == [True, True, False, True]
    assert r.truncated.tolist() == [True, False, False, False]
    st_ = r.stats([1, 1, 0, 1])
    assert st_["mode"] == "token_tis"
    assert st_["frac_truncated"] == pytest.approx(1 / 3)
    assert st_["frac_masked"] == 0.0
    assert st_["weight_mean"] == pytest.approx(4 / 3)
    assert (st_["weight_min"], st_["weight_max"]) == pytest.approx((0.5, 2.0))


def test_seq_tis_caps_the_product_per_row_and_broadcasts() -> None:
    lr = [[L(2), L(2), 0.0], [L(0.5), 0.0, 9.0]]
    mask = [[1, 1, 0], [1, 1, 0]]
    np.testing.assert_allclose(sequence_log_rho(lr, mask), [L(4), L(0.5)])
    r = seq_tis(lr, mask, cap=3.0)
    np.testing.assert_allclose(r.weights, [[3.0, 3.0, 0.0], [0.5, 0.5, 0.0]])
    assert r.truncated.tolist() == [[True, True, False], [False, False, False]]
    assert r.keep.tolist() == [[True, True, False], [True, True, False]]


def test_seq_mis_keeps_in_band_products_and_rejects_the_rest() -> None:
    lr = [[L(2), L(2)], [L(0.5), 0.0], [L(1.5), 0.0]]
    r = seq_mis(lr, [[1, 1], [1, 1], [1, 0]], low=0.5, high=2.0)
    # products 4 (rejected), 0.5 (kept: bands are inclusive), 1.5
    np.testing.assert_allclose(r.weights, [[0.0, 0.0], [0.5, 0.5], [1.5, 0.0]])
    assert r.keep.tolist() == [[False, False], [True, True], [True, False]]
    assert r.stats([[1, 1], [1, 1], [1, 0]])["frac_masked"] == pytest.approx(2 / 5)


def test_icepop_masks_tokens_outside_the_band() -> None:
    r = icepop([L(6), L(0.4), L(2), L(0.5), L(5)], [1, 1, 1, 1, 1], low=0.5, high=5.0)
    np.testing.assert_allclose(r.weights, [0.0, 0.0, 2.0, 0.5, 5.0])
    assert r.keep.tolist() == [False, False, True, True, True]
    s = r.stats([1] * 5)
    assert s["frac_masked"] == pytest.approx(0.4)
    assert s["kept_tokens"] == 3


def test_geometric_rejection_is_length_invariant() -> None:
    lr = [[L(1.02), L(1.02), 0.0], [L(1.005)] * 3, [0.0, 0.0, 0.0]]
    mask = [[1, 1, 0], [1, 1, 1], [0, 0, 0]]
    assert geometric_rs_keep(lr, mask, 0.99, 1.01).tolist() == [False, True, True]


def test_k3_rejection_uses_the_mean_per_token_k3() -> None:
    lr = [[L(2), -L(2), 0.0]]  # mean k3 = 1/6
    assert k3_rs_keep(lr, [[1, 1, 1]], delta=0.2).tolist() == [True]
    assert k3_rs_keep(lr, [[1, 1, 1]], delta=0.1).tolist() == [False]


def test_m2po_masks_largest_second_moments_until_mean_below_tau() -> None:
    lr = [0.1, -0.3, 0.5, 0.0, 9.0]
    mask = [1, 1, 1, 1, 0]
    # squares 0.01, 0.09, 0.25, 0 -> ascending prefix means 0, 0.005, 0.0333, 0.0875
    assert m2po_keep(lr, mask, tau=0.04).tolist() == [True, True, False, True, False]
    assert m2po_keep(lr, mask, tau=0.001).tolist() == [False, False, False, True, False]
    assert m2po_keep(lr, mask, tau=1.0).tolist() == [True, True, True, True, False]
    # batch level: the mask is chosen over all rows together
    keep = m2po_keep([[0.1, -0.3], [0.5, 0.0]], [[1, 1], [1, 1]], tau=0.04)
    assert keep.tolist() == [[True, True], [False, True]]
    r = m2po(lr, mask, tau=0.04)
    np.testing.assert_allclose(r.weights, [1.0, 1.0, 0.0, 1.0, 0.0])


def test_apply_correction_dispatches_with_configured_caps() -> None:
    lr = np.array([[L(3), L(0.25)]])
    mask = np.array([[1, 1]])
    cfg = CorrectionConfig()
    expected = {
        CorrectionMode.NONE: [[1.0, 1.0]],
        CorrectionMode.TOKEN_TIS: [[2.0, 0.25]],
        CorrectionMode.SEQ_TIS: [[0.75, 0.75]],
        CorrectionMode.SEQ_MIS: [[0.75, 0.75]],
        CorrectionMode.ICEPOP: [[3.0, 0.0]],
        CorrectionMode.M2PO: [[0.0, 0.0]],  # both (log rho)^2 > 0.04
    }
    for mode, w in expected.items():
        r = apply_correction(lr, mask, cfg, mode)
        assert r.mode is mode
        np.testing.assert_allclose(r.weights, w, err_msg=mode.value)
    assert apply_correction(lr, mask, cfg).mode is CorrectionMode.TOKEN_TIS
    assert no_correction(lr, mask).keep.all()


def test_inputs_are_validated() -> None:
    with pytest.raises(DivergenceInputError):
        token_tis([0.0, 1.0], [1], cap=2.0)
    with pytest.raises(DivergenceInputError):
        token_tis([0.0, float("inf")], [1, 1], cap=2.0)
    with pytest.raises(ValueError, match="cap"):
        token_tis([0.0], [1], cap=0.0)
    # padding may hold anything: it is ignored
    np.testing.assert_allclose(token_tis([0.0, float("nan")], [1, 0], 2.0).weights, [1.0, 0.0])
    with pytest.raises(ValueError):
        CorrectionConfig(seq_mis_low=3.0, seq_mis_high=2.0)


# ---------------------------------------------------------------- properties
rows = hnp.arrays(
    np.float64, st.tuples(st.integers(1, 4), st.integers(1, 16)),
    elements=st.floats(min_value=-1000.0, max_value=1000.0, allow_nan=False),
)
caps = st.floats(min_value=1.0, max_value=10.0)


def _mask_for(lr: np.ndarray, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2, size=lr.shape)


@settings(max_examples=150, deadline=None)
@given(rows, caps, st.integers(0, 2**16))
def test_property_tis_weights_are_within_zero_and_cap(lr: np.ndarray, cap: float, seed: int) -> None:
    mask = _mask_for(lr, seed)
    for r in (token_tis(lr, mask, cap), seq_tis(lr, mask, cap)):
        assert np.isfinite(r.weights).all()
        assert (r.weights >= 0).all() and (r.weights <= cap).all()
        assert (r.weights[mask == 0] == 0).all()


@settings(max_examples=150, deadline=None)
@given(rows, st.integers(0, 2**16))
def test_property_band_rules_weight_in_band_or_zero(lr: np.ndarray, seed: int) -> None:
    mask = _mask_for(lr, seed)
    for r in (icepop(lr, mask, 0.5, 5.0), seq_mis(lr, mask, 0.5, 2.0)):
        hi = 5.0 if r.mode is CorrectionMode.ICEPOP else 2.0
        kept = r.weights[r.keep]
        assert ((kept >= 0.5) & (kept <= hi)).all()
        assert (r.weights[~r.keep] == 0).all()
        assert not (r.keep & (mask == 0)).any()


@settings(max_examples=150, deadline=None)
@given(rows, st.floats(min_value=0.0, max_value=5.0), st.integers(0, 2**16))
def test_property_m2po_kept_second_moment_below_tau(lr: np.ndarray, tau: float, seed: int) -> None:
    mask = _mask_for(lr, seed)
    keep = m2po_keep(lr, mask, tau)
    assert not (keep & (mask == 0)).any()
    if keep.any():
        assert float(np.mean(lr[keep] ** 2)) <= tau * (1 + 1e-12)
    # maximal: adding back the smallest masked square would break the bound
    dropped = (mask != 0) & ~keep
    if dropped.any():
        extra = float(np.min(lr[dropped] ** 2))
        assert (float(np.sum(lr[keep] ** 2)) + extra) / (int(keep.sum()) + 1) > tau
