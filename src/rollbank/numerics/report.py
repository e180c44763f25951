"""Engine/trainer numerics mismatch on the same tokens: the report math (pure, numpy).

Notation: ``reference`` is the log-prob a token got from one scorer (the engine: the
behaviour ``l_mu`` a batch carries), ``candidate`` from another (the trainer: ``l_pi``);
``delta = candidate - reference`` per scored token is the ``log rho`` that an importance
correction would see if both ran the *same* weights, i.e. pure numerics. Statistics:

- ``abs``: mean / max / percentiles of ``|delta|`` and the share of tokens with
  ``|delta| > t`` for each threshold ``t`` (default 0.1 and 0.5 nats);
- ``histogram``: token counts of ``|delta|`` over fixed log-spaced bins (:data:`ABS_EDGES`);
- ``divergence``: :func:`rollbank.staleness.estimators.divergence_stats` of ``delta`` (``k3``
  is the mismatch KL(reference || candidate) estimated on tokens the reference sampled);
- ``corrections``: what an IS correction carries for it (:func:`apply_correction` stats of
  token TIS, sequence TIS and IcePop with the default :class:`CorrectionConfig`);
- ``by_position`` / ``by_frequency``: the ``abs`` and ``k3`` of tokens grouped by absolute
  position in the sequence and by how often the token id occurs in the scored corpus.

Inputs are right-padded ``[B, T]`` arrays with a ``mask`` (non-zero = scored token); the
token at column ``t`` of row ``b`` is ``token_ids[b, t]`` at position ``t``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from rollbank.quantiles import quantiles
from rollbank.staleness.config import CorrectionConfig, CorrectionMode, EstimatorConfig
from rollbank.staleness.corrections import apply_correction
from rollbank.staleness.estimators import divergence_stats, k3_terms, log_rho, normalized_ess

ArrayLike = npt.ArrayLike
FloatArray = npt.NDArray[np.float64]

ABS_EDGES: tuple[float, ...] = (0.0, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.1, 0.5, 1.0, math.inf)
POSITION_EDGES: tuple[float, ...] = (0, 32, 64, 128, 256, 512, 1024, math.inf)
FREQUENCY_EDGES: tuple[float, ...] = (1, 2, 5, 20, 100, math.inf)
THRESHOLDS: tuple[float, ...] = (0.1, 0.5)
PERCENTILES: tuple[float, ...] = (50.0, 90.0, 99.0, 99.9)
CORRECTIONS = (CorrectionMode.TOKEN_TIS, CorrectionMode.SEQ_TIS, CorrectionMode.ICEPOP)


def _edge(x: float) -> str:
    return "inf" if math.isinf(x) else f"{x:g}"


def bucket_labels(edges: Sequence[float]) -> list[str]:
    """``[lo, hi)`` labels of consecutive ``edges``, e.g. ``"32-64"`` and ``"1024-inf"``."""
    return [f"{_edge(lo)}-{_edge(hi)}" for lo, hi in itertools.pairwise(edges)]


def bucket_index(values: ArrayLike, edges: Sequence[float]) -> npt.NDArray[np.int64]:
    """Index ``i`` of the bucket ``edges[i] <= v < edges[i + 1]`` of every value (-1: below
    ``edges[0]``; values at or beyond the last edge fall in the last bucket)."""
    v = np.asarray(values, dtype=np.float64)
    idx = np.searchsorted(np.asarray(edges, dtype=np.float64), v, side="right") - 1
    return np.asarray(np.minimum(idx, len(edges) - 2), dtype=np.int64)


def abs_histogram(abs_delta: ArrayLike, edges: Sequence[float] = ABS_EDGES) -> dict[str, int]:
    """Token counts of ``|delta|`` per bucket (``edges[i] <= x < edges[i+1]``)."""
    idx = bucket_index(abs_delta, edges)
    counts = np.bincount(idx[idx >= 0], minlength=len(edges) - 1)
    return dict(zip(bucket_labels(edges), (int(c) for c in counts), strict=True))


def abs_summary(delta: ArrayLike, thresholds: Sequence[float] = THRESHOLDS) -> dict[str, Any]:
    """``n``, mean / max / percentiles of ``|delta|``, share over each threshold, mean k3."""
    a = np.abs(np.asarray(delta, dtype=np.float64).ravel())
    if a.size == 0:
        return {"n": 0, "mean": 0.0, "max": 0.0, "k3": 0.0,
                "percentiles": {f"p{q:g}": 0.0 for q in PERCENTILES},
                "share_over": {f"{t:g}": 0.0 for t in thresholds}}
    return {
        "n": int(a.size),
        "mean": float(np.mean(a)),
        "max": float(np.max(a)),
        "k3": float(np.mean(k3_terms(np.asarray(delta, dtype=np.float64).ravel()))),
        "percentiles": {f"p{q:g}": float(v or 0.0) for q, v in
                        zip(PERCENTILES, quantiles(a, [q / 100 for q in PERCENTILES]),
                            strict=True)},  # nearest rank (rollbank.quantiles)
        "share_over": {f"{t:g}": float(np.mean(a > t)) for t in thresholds},
    }


def grouped(delta: FloatArray, keys: ArrayLike, edges: Sequence[float],
            thresholds: Sequence[float] = THRESHOLDS) -> dict[str, dict[str, Any]]:
    """:func:`abs_summary` of ``delta`` per bucket of ``keys`` (non-empty buckets only)."""
    idx = bucket_index(keys, edges)
    out: dict[str, dict[str, Any]] = {}
    for i, label in enumerate(bucket_labels(edges)):
        sel = idx == i
        if sel.any():
            out[label] = abs_summary(delta[sel], thresholds)
    return out


def token_counts(token_ids: ArrayLike, mask: ArrayLike) -> npt.NDArray[np.int64]:
    """``[B, T]``: how many times each position's token id occurs among all masked tokens."""
    ids = np.asarray(token_ids, dtype=np.int64)
    m = np.asarray(mask) != 0
    uniq, inverse, counts = np.unique(ids[m], return_inverse=True, return_counts=True)
    del uniq
    out = np.zeros(ids.shape, dtype=np.int64)
    out[m] = counts[inverse]
    return out


def compare(
    reference: ArrayLike, candidate: ArrayLike, mask: ArrayLike, token_ids: ArrayLike, *,
    thresholds: Sequence[float] = THRESHOLDS, position_edges: Sequence[float] = POSITION_EDGES,
    frequency_edges: Sequence[float] = FREQUENCY_EDGES,
    correction: CorrectionConfig | None = None,
) -> dict[str, Any]:
    """The mismatch report of ``candidate`` against ``reference`` (see the module doc)."""
    m = np.asarray(mask) != 0
    lr = log_rho(reference, candidate, m)  # validates shapes and finiteness
    ids = np.asarray(token_ids, dtype=np.int64)
    if ids.shape != lr.shape:
        raise ValueError(f"token_ids {ids.shape} != log-probs {lr.shape}")
    delta = lr[m]
    positions = np.broadcast_to(np.arange(lr.shape[-1]), lr.shape)[m]
    freq = token_counts(ids, m)[m]
    cfg = correction or CorrectionConfig()
    est = EstimatorConfig(abs_log_rho_thresholds=tuple(thresholds))
    rows = m.any(axis=1)
    seq_log_w = lr.sum(axis=1)[rows]
    corrections = {mode.value: apply_correction(lr, m, cfg, mode).stats(m) for mode in CORRECTIONS}
    return {
        "abs": abs_summary(delta, thresholds),
        "histogram": abs_histogram(np.abs(delta)),
        "divergence": divergence_stats(delta, est).to_dict(),
        "seq_ess": normalized_ess(seq_log_w),
        "corrections": corrections,
        "by_position": grouped(delta, positions, position_edges, thresholds),
        "by_frequency": grouped(delta, freq, frequency_edges, thresholds),
    }


def alignment_summary(comparisons: dict[str, dict[str, Any]], baseline: str,
                      aligned: Sequence[str]) -> dict[str, Any]:
    """What aligning buys: ``baseline``'s mean |delta| and k3 next to each ``aligned``
    comparison's, with the reduction factor (baseline / aligned; None when aligned is 0) and
    the residual share over each threshold that an IS correction has to carry."""
    base = comparisons[baseline]["abs"]
    out: dict[str, Any] = {"baseline": baseline, "baseline_mean_abs": base["mean"],
                           "baseline_k3": base["k3"], "aligned": {}}
    for name in aligned:
        a = comparisons[name]["abs"]
        out["aligned"][name] = {
            "mean_abs": a["mean"], "k3": a["k3"], "max_abs": a["max"],
            "share_over": a["share_over"],
            "k3_reduction": base["k3"] / a["k3"] if a["k3"] > 0 else None,
            "tis_frac_truncated": comparisons[name]["corrections"]["token_tis"]["frac_truncated"],
        }
    return out
