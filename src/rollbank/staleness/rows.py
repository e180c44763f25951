"""Glue for the callers: judge a group from its trajectories, compute a batch's corrections,
and the per-row values of the proposed batch-schema columns (schema version 2).

Pure functions; the current-policy log-probs are obtained by the caller (engine scoring or
trainer recompute) and passed in. :data:`STALENESS_FIELDS` are the schema-v2 columns (defined
in ``batching/schema.py``, the lower layer, and re-exported here); :func:`row_values` fills
them and :func:`score_batch` fills a whole :class:`~rollbank.batching.batch.Batch`.

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
                                                batch through the ready bank; scored after
                                                emission by score_batch: exclude, with weight
                                                0 and no kept token) | unmeasured
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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from rollbank.batching.batch import Batch, StalenessColumns
from rollbank.batching.schema import DIVERGENCE_FIELDS, STALENESS_FIELDS
from rollbank.episodes.trajectory import Trajectory
from rollbank.staleness.config import (
    CorrectionConfig,
    CorrectionMode,
    EstimatorConfig,
    GateConfig,
    StalenessConfig,
)
from rollbank.staleness.corrections import CorrectionResult, apply_correction
from rollbank.staleness.estimators import (
    BatchDivergence,
    DivergenceStats,
    ScoredTokens,
    batch_divergence,
    trajectory_divergence,
)
from rollbank.staleness.gate import (
    GateDecision,
    GateInput,
    GroupGateDecision,
    StalenessGate,
    Verdict,
)
from rollbank.staleness.report import staleness_report

__all__ = [
    "DIVERGENCE_FIELDS", "STALENESS_FIELDS", "BatchScoring", "GroupMember", "JudgedGroup",
    "batch_corrections", "judge_group", "row_values", "score_batch",
]

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


@dataclass(frozen=True)
class BatchScoring:
    """A batch scored against the current policy: the batch with its staleness columns
    filled, and what they were computed from."""

    batch: Batch  # ``batch.staleness`` set (rows + report)
    divergence: BatchDivergence | None  # None when no row was measured
    decisions: tuple[GateDecision, ...]  # one per row, in row order
    corrections: dict[str, CorrectionResult]  # trajectory id -> per-token weights/keep
    report: dict[str, Any]


def score_batch(
    batch: Batch,
    current: Mapping[str, Sequence[float] | None],
    *,
    current_version: int,
    config: StalenessConfig | None = None,
    gate: StalenessGate | None = None,
    scorer: str = "trainer_recompute",
) -> BatchScoring:
    """Measure an already assembled batch against the current policy's log-probs.

    ``current`` maps a trajectory id to the current policy's log-prob of each of its tokens
    (missing or None: unmeasured). Each group is judged by ``gate`` (default: a disabled gate,
    which admits every row with weight 1: measurement and correction only). A batch has left
    the ready bank, so a slot can no longer be re-run: a row the gate would drop keeps its
    place with verdict ``exclude``, ``gate_weight`` 0 and no kept token (it leaves the loss
    and its normaliser; the group's advantages are unchanged). Corrections use
    ``config.correction`` (its ``mode``) over the measured rows together.
    """
    cfg = config or StalenessConfig()
    judge = gate or StalenessGate(GateConfig(enabled=False))
    decisions: list[GateDecision] = []
    scored: dict[str, ScoredTokens] = {}
    divergence: dict[str, DivergenceStats | None] = {}
    for group in batch.groups:
        members = [GroupMember(t, current.get(t.trajectory_id)) for t in group.trajectories]
        judged = judge_group(judge, group.group_id, members, current_version, cfg.estimators)
        decisions.extend(judged.decision.decisions)
        scored.update(judged.scored)
        divergence.update(judged.divergence)
    rows_scored = list(scored.values())
    results, correction_stats = batch_corrections(rows_scored, cfg.correction)
    corrections = {s.trajectory_id: r for s, r in zip(rows_scored, results, strict=True)}
    values: dict[str, dict[str, Any]] = {}
    trajs = {t.trajectory_id: t for t in batch.trajectories}
    for d in decisions:
        t = trajs[d.trajectory_id]
        row = row_values(
            d if d.keep else replace(d, verdict=Verdict.ADMIT),  # overwritten below
            scored=scored.get(t.trajectory_id), correction=corrections.get(t.trajectory_id),
            divergence=divergence[t.trajectory_id], loss_mask=t.loss_mask,
            scorer_version=current_version,
        )
        if not d.keep:
            row.update(gate_verdict=Verdict.EXCLUDE.value, gate_weight=0.0,
                       is_weights=[0.0] * len(t.loss_mask), is_keep=[0] * len(t.loss_mask))
        values[t.trajectory_id] = row
    pooled = batch_divergence(rows_scored, current_version, cfg.estimators) if rows_scored else None
    report = staleness_report(
        pooled, decisions, correction=correction_stats if rows_scored else None,
        current_version=current_version, scorer=scorer,
    )
    out = replace(batch, staleness=StalenessColumns(values, report))
    return BatchScoring(out, pooled, tuple(decisions), corrections, report)
