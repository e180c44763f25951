"""Importance-sampling corrections from per-token log rho (pure numpy, any leading shape).

Inputs are ``log_rho`` (``l_pi - l_mu``, see :mod:`rollbank.staleness.estimators`) and the loss
mask, both shaped ``[..., T]`` (one trajectory ``[T]`` or a padded batch ``[B, T]``);
sequence-level rules reduce over the last axis. Every rule returns a
:class:`CorrectionResult`: the per-token weight (treated as a constant, stop-grad, by the
loss) and the per-token ``keep`` mask. A rejected token or sequence has weight 0 **and**
``keep`` False: the loss must leave it out of its normaliser too, not only out of the
numerator (otherwise rejection silently rescales the gradient; cf. THUDM/slime#657).

Rules (rho = exp(log rho), S = sum of log rho over the sequence's model tokens)

=========  ==========  ====================================================  ===================
rule       level       weight / keep                                         source
=========  ==========  ====================================================  ===================
token TIS  token       w_t = min(rho_t, C); keep every model token           Yao et al. 2025,
                                                                             "Your efficient RL
                                                                             framework secretly
                                                                             brings you
                                                                             off-policy RL";
                                                                             verl
seq TIS    sequence    w = min(exp(S), C_seq) on every model token           verl rollout corr.
seq MIS    sequence    w = exp(S) if lo <= exp(S) <= hi else reject sequence verl; TRL
IcePop     token       w_t = rho_t if lo <= rho_t <= hi else mask the token  Ring-1T,
                                                                             arXiv 2510.18855
geo RS     sequence    keep iff lo <= exp(S / n) <= hi (length-invariant)    verl
k3 RS      sequence    keep iff mean_t(rho_t - 1 - log rho_t) <= delta       verl
M2PO       batch       mask the largest (log rho)^2 until the mean over      arXiv 2510.01161
                       kept tokens is <= tau; weight 1 on kept tokens
=========  ==========  ====================================================  ===================

Caps and bands are compared in log space (``min(S, log C)``), so nothing overflows, and the
weights are clipped once more after ``exp`` so that rounding cannot push one past its cap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from rollbank.staleness.config import CorrectionConfig, CorrectionMode
from rollbank.staleness.estimators import (
    ArrayLike,
    BoolArray,
    DivergenceInputError,
    FloatArray,
    k3_terms,
    model_mask,
)


@dataclass(frozen=True)
class CorrectionResult:
    """Per-token weights and keep mask of one correction rule (same shape as the input)."""

    mode: CorrectionMode
    weights: FloatArray  # 0.0 on prompt/env tokens and on rejected tokens
    keep: BoolArray  # model tokens that stay in the loss (numerator and normaliser)
    truncated: BoolArray  # model tokens whose weight hit a cap (TIS rules)

    def stats(self, loss_mask: ArrayLike) -> dict[str, Any]:
        """Batch-report statistics over model tokens: weight moments, masked/truncated share."""
        m = model_mask(loss_mask)
        n = int(m.sum())
        kept = self.weights[self.keep & m]
        return {
            "mode": self.mode.value,
            "model_tokens": n,
            "kept_tokens": int(kept.size),
            "frac_masked": float(np.mean(~self.keep[m])) if n else 0.0,
            "frac_truncated": float(np.mean(self.truncated[m])) if n else 0.0,
            "weight_mean": float(np.mean(kept)) if kept.size else 0.0,
            "weight_std": float(np.std(kept)) if kept.size else 0.0,
            "weight_min": float(np.min(kept)) if kept.size else 0.0,
            "weight_max": float(np.max(kept)) if kept.size else 0.0,
        }


def _inputs(log_rho: ArrayLike, loss_mask: ArrayLike) -> tuple[FloatArray, BoolArray]:
    lr = np.asarray(log_rho, dtype=np.float64)
    m = model_mask(loss_mask)
    if lr.shape != m.shape or lr.ndim == 0:
        raise DivergenceInputError(f"log_rho {lr.shape} and loss_mask {m.shape} must match, >= 1-D")
    if not np.isfinite(lr[m]).all():
        raise DivergenceInputError("log rho of a model token is not finite")
    return np.where(m, lr, 0.0), m


def _log(x: float, what: str) -> float:
    if not x > 0:
        raise ValueError(f"{what} must be > 0, got {x}")
    return math.log(x)


def _broadcast(seq_values: FloatArray, m: BoolArray) -> FloatArray:
    return np.where(m, seq_values[..., None], 0.0)


def sequence_log_rho(log_rho: ArrayLike, loss_mask: ArrayLike) -> FloatArray:
    """``S = sum`` of log rho over each sequence's model tokens (shape ``[...]``)."""
    lr, _ = _inputs(log_rho, loss_mask)
    return np.asarray(np.sum(lr, axis=-1), dtype=np.float64)


def no_correction(log_rho: ArrayLike, loss_mask: ArrayLike) -> CorrectionResult:
    """Weight 1 on every model token (plain on-policy loss)."""
    _, m = _inputs(log_rho, loss_mask)
    return CorrectionResult(CorrectionMode.NONE, m.astype(np.float64), m.copy(), np.zeros_like(m))


def token_tis(log_rho: ArrayLike, loss_mask: ArrayLike, cap: float) -> CorrectionResult:
    """Truncated IS per token: ``w_t = min(rho_t, C)``; every model token is kept."""
    lr, m = _inputs(log_rho, loss_mask)
    log_c = _log(cap, "cap")
    w = np.where(m, np.minimum(np.exp(np.minimum(lr, log_c)), cap), 0.0)
    return CorrectionResult(CorrectionMode.TOKEN_TIS, w, m.copy(), m & (lr > log_c))


def seq_tis(log_rho: ArrayLike, loss_mask: ArrayLike, cap: float) -> CorrectionResult:
    """Truncated IS per sequence: ``w = min(prod_t rho_t, C)`` on each of its model tokens."""
    lr, m = _inputs(log_rho, loss_mask)
    log_c = _log(cap, "cap")
    s = np.sum(lr, axis=-1)
    w = np.minimum(np.exp(np.minimum(s, log_c)), cap)
    return CorrectionResult(
        CorrectionMode.SEQ_TIS, _broadcast(w, m), m.copy(), m & (s > log_c)[..., None]
    )


def seq_mis(log_rho: ArrayLike, loss_mask: ArrayLike, low: float, high: float) -> CorrectionResult:
    """Masked IS per sequence: weight ``prod rho`` if it lies in ``[low, high]``, else rejected."""
    lr, m = _inputs(log_rho, loss_mask)
    lo, hi = _log(low, "low"), _log(high, "high")
    s = np.sum(lr, axis=-1)
    ok = (s >= lo) & (s <= hi)
    w = np.where(ok, np.clip(np.exp(np.clip(s, lo, hi)), low, high), 0.0)
    keep = m & ok[..., None]
    return CorrectionResult(CorrectionMode.SEQ_MIS, _broadcast(w, keep), keep, np.zeros_like(m))


def icepop(log_rho: ArrayLike, loss_mask: ArrayLike, low: float, high: float) -> CorrectionResult:
    """IcePop: ``w_t = rho_t`` if ``low <= rho_t <= high``, else the token is masked out."""
    lr, m = _inputs(log_rho, loss_mask)
    lo, hi = _log(low, "low"), _log(high, "high")
    keep = m & (lr >= lo) & (lr <= hi)
    w = np.where(keep, np.clip(np.exp(np.clip(lr, lo, hi)), low, high), 0.0)
    return CorrectionResult(CorrectionMode.ICEPOP, w, keep, np.zeros_like(m))


def geometric_rs_keep(
    log_rho: ArrayLike, loss_mask: ArrayLike, low: float, high: float
) -> BoolArray:
    """Geometric rejection: keep a sequence iff ``low <= exp(S / n) <= high`` (n model tokens).

    A sequence without model tokens has ratio 1 by convention.
    """
    lr, m = _inputs(log_rho, loss_mask)
    n = np.sum(m, axis=-1)
    mean = np.sum(lr, axis=-1) / np.maximum(n, 1)
    return np.asarray((mean >= _log(low, "low")) & (mean <= _log(high, "high")), dtype=np.bool_)


def k3_rs_keep(log_rho: ArrayLike, loss_mask: ArrayLike, delta: float) -> BoolArray:
    """k3 rejection: keep a sequence iff its mean per-token k3 is ``<= delta``."""
    lr, m = _inputs(log_rho, loss_mask)
    terms = np.where(m, k3_terms(lr), 0.0)
    mean = np.sum(terms, axis=-1) / np.maximum(np.sum(m, axis=-1), 1)
    return np.asarray(mean <= delta, dtype=np.bool_)


def m2po_keep(log_rho: ArrayLike, loss_mask: ArrayLike, tau: float) -> BoolArray:
    """M2PO: mask the model tokens with the largest ``(log rho)^2`` (over the whole input)
    until the mean ``(log rho)^2`` of the kept tokens is ``<= tau``; returns the keep mask.

    Prefix means of the ascending-sorted squares are non-decreasing, so the kept set is the
    longest ascending prefix whose mean is ``<= tau`` (ties broken by position).
    """
    lr, m = _inputs(log_rho, loss_mask)
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    flat_idx = np.flatnonzero(m)
    sq = (lr.ravel()[flat_idx]) ** 2
    order = np.argsort(sq, kind="stable")
    prefix_mean = np.cumsum(sq[order]) / np.arange(1, sq.size + 1)
    n_keep = int(np.searchsorted(prefix_mean, tau, side="right"))
    keep = np.zeros(m.size, dtype=np.bool_)
    keep[flat_idx[order[:n_keep]]] = True
    return keep.reshape(m.shape)


def m2po(log_rho: ArrayLike, loss_mask: ArrayLike, tau: float) -> CorrectionResult:
    """M2PO as a correction: weight 1 on the kept tokens (see :func:`m2po_keep`)."""
    _, m = _inputs(log_rho, loss_mask)
    keep = m2po_keep(log_rho, loss_mask, tau)
    return CorrectionResult(CorrectionMode.M2PO, keep.astype(np.float64), keep, np.zeros_like(m))


def apply_correction(
    log_rho: ArrayLike,
    loss_mask: ArrayLike,
    config: CorrectionConfig,
    mode: CorrectionMode | None = None,
) -> CorrectionResult:
    """The correction ``mode`` (default: ``config.mode``) with the configured caps and bands."""
    match mode or config.mode:
        case CorrectionMode.NONE:
            return no_correction(log_rho, loss_mask)
        case CorrectionMode.TOKEN_TIS:
            return token_tis(log_rho, loss_mask, config.tis_cap)
        case CorrectionMode.SEQ_TIS:
            return seq_tis(log_rho, loss_mask, config.seq_tis_cap)
        case CorrectionMode.SEQ_MIS:
            return seq_mis(log_rho, loss_mask, config.seq_mis_low, config.seq_mis_high)
        case CorrectionMode.ICEPOP:
            return icepop(log_rho, loss_mask, config.icepop_low, config.icepop_high)
        case CorrectionMode.M2PO:
            return m2po(log_rho, loss_mask, config.m2po_tau)
