"""Glue for the callers: judge a group from its trajectories, compute a batch's corrections,
and the per-row values of the proposed batch-schema columns (schema version 2).

Pure functions; the current-policy log-probs are obtained by the caller (engine scoring or
trainer recompute) and passed in. :data:`STALENESS_FIELDS` are the columns proposed for
``batching/schema.py`` (that module is not changed here); :func:`row_values` fills them.

==================  ==========================  ==============================================
column              type                        meaning
==================  ==========================  ==============================================
current_logprobs    list<float32> (nullable)    current policy's log-prob per token (0.0 where
                                                loss_mask is 0); null when unmeasured
scorer_version      int32                       weight version that scored current_logprobs
                                                (-1 when unmeasured)
is_weights          list<float32>               per-token weight of the active correction
                                                (0.0 on prompt/env and rejected tokens)
is_keep             list<int8>                  1: the token stays in the loss (numerator and
                                                normaliser); loss_mask AND the correction's keep
gate_verdict        string                      admit | downweight (dropped rows never reach a
                                                batch)
gate_weight         float32                     the gate's trajectory weight (1.0 if admitted);
                                                the loss multiplies is_weights by it
gate_reasons        list<string>                GateReason values
rare_success        bool                        kept instead of dropped: only success of group
stale_retries       int16                       re-runs of this slot caused by the gate
divergence          struct<...> (nullable)      n_tokens, mean_log_rho, geo_ratio, k1, k3,
                                                k3_sum, chi2, ess, max_abs_log_rho of this row
==================  ==========================  ==============================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from rollbank.episodes.trajectory import Trajectory
from rollbank.staleness.config import CorrectionConfig, CorrectionMode, EstimatorConfig
from rollbank.staleness.corrections import CorrectionResult, apply_correction
from rollbank.staleness.estimators import (
    DivergenceStats,
    ScoredTokens,
    trajectory_divergence,
)
from rollbank.staleness.gate import GateDecision, GateInput, GroupGateDecision, StalenessGate

DIVERGENCE_FIELDS = (
    "n_tokens", "mean_log_rho", "geo_ratio", "k1", "k3", "k3_sum", "chi2", "ess",
    "max_abs_log_rho",
)

STALENESS_FIELDS: tuple[pa.Field, ...] = (
    pa.field("current_logprobs", pa.list_(pa.float32()), nullable=True),
    pa.field("scorer_version", pa.int32(), nullable=False),
    pa.field("is_weights", pa.list_(pa.float32()), nullable=False),
    pa.field("is_keep", pa.list_(pa.int8()), nullable=False),
    pa.field("gate_verdict", pa.string(), nullable=False),
    pa.field("gate_weight", pa.float32(), nullable=False),
    pa.field("gate_reasons", pa.list_(pa.string()), nullable=False),
    pa.field("rare_success", pa.bool_(), nullable=False),
    pa.field("stale_retries", pa.int16(), nullable=False),
    pa.field(
        "divergence",
        pa.struct([pa.field("n_tokens", pa.int32(), nullable=False)] + [
            pa.field(n, pa.float64(), nullable=False) for n in DIVERGENCE_FIELDS[1:]
        ]),
        nullable=True,
    ),
)


@dataclass(frozen=True)
class GroupMember:
    """One valid sibling handed to the gate: its trajectory and the current log-probs."""

    trajectory: Trajectory
    current_logprobs: Sequence[float] | None  # one per token of the trajectory; None: unmeasured
    stale_retries: int = 0


@dataclass(frozen=True)
class JudgedGroup:
    decision: GroupGateDecision
    scored: dict[str, ScoredTokens]  # trajectory id -> tokens (measured members only)
    divergence: dict[str, DivergenceStats | None]


def judge_group(
    gate: StalenessGate,
    group_id: str,
    members: Sequence[GroupMember],
    current_version: int,
    estimators: EstimatorConfig | None = None,
) -> JudgedGroup:
    """Measure every member against the current policy and let ``gate`` decide the group."""
    scored: dict[str, ScoredTokens] = {}
    divergence: dict[str, DivergenceStats | None] = {}
    inputs: list[GateInput] = []
    for m in members:
        t = m.trajectory
        d: DivergenceStats | None = None
        if m.current_logprobs is not None:
            s = ScoredTokens.from_trajectory(t, m.current_logprobs)
            scored[t.trajectory_id] = s
            d = trajectory_divergence(s, estimators)
        divergence[t.trajectory_id] = d
        inputs.append(GateInput.from_trajectory(t, d, current_version, m.stale_retries))
    return JudgedGroup(gate.decide_group(group_id, inputs), scored, divergence)


def batch_corrections(
    scored: Sequence[ScoredTokens], config: CorrectionConfig, mode: CorrectionMode | None = None
) -> tuple[list[CorrectionResult], dict[str, Any]]:
    """The correction for every row, computed on the padded batch (M2PO is batch-level), split
    back into per-row results (1-D, each row's length), and its batch statistics."""
    lengths = [len(s.loss_mask) for s in scored]
    width = max(lengths, default=0)
    lr = np.zeros((len(scored), width))
    mask = np.zeros((len(scored), width), dtype=np.int8)
    for i, s in enumerate(scored):
        n = lengths[i]
        lr[i, :n] = np.where(s.loss_mask, s.current - s.behaviour, 0.0)
        mask[i, :n] = s.loss_mask
    if not scored:
        lr, mask = np.zeros((0, 1)), np.zeros((0, 1), dtype=np.int8)
    res = apply_correction(lr, mask, config, mode)
    rows = [
        CorrectionResult(res.mode, res.weights[i, :n], res.keep[i, :n], res.truncated[i, :n])
        for i, n in enumerate(lengths)
    ]
    return rows, res.stats(mask)


def row_values(
    decision: GateDecision,
    *,
    scored: ScoredTokens | None,
    correction: CorrectionResult | None,
    divergence: DivergenceStats | None,
    loss_mask: Sequence[int],
    scorer_version: int,
    stale_retries: int = 0,
) -> dict[str, Any]:
    """Values of :data:`STALENESS_FIELDS` for one row. Unmeasured rows (``scored`` None) get
    null ``current_logprobs``/``divergence`` and weight 1 on their model tokens."""
    if not decision.keep:
        raise ValueError(f"{decision.trajectory_id}: a {decision.verdict.value} row has no batch row")
    mask = np.asarray(loss_mask) != 0
    if correction is None:
        weights, keep = mask.astype(np.float64), mask
    else:
        weights, keep = correction.weights, correction.keep & mask
    current = None
    if scored is not None:
        current = np.where(scored.loss_mask, scored.current, 0.0).astype(np.float32).tolist()
    return {
        "current_logprobs": current,
        "scorer_version": scorer_version if scored is not None else -1,
        "is_weights": np.asarray(weights, dtype=np.float32).tolist(),
        "is_keep": np.asarray(keep, dtype=np.int8).tolist(),
        "gate_verdict": decision.verdict.value,
        "gate_weight": decision.weight,
        "gate_reasons": [r.value for r in decision.reasons],
        "rare_success": decision.rare_success,
        "stale_retries": stale_retries,
        "divergence": (
            {k: getattr(divergence, k) for k in DIVERGENCE_FIELDS} if divergence else None
        ),
    }
