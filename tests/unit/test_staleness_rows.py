"""Glue: judging a group from trajectories, batch corrections, proposed column values."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.staleness.config import CorrectionConfig, CorrectionMode
from rollbank.staleness.gate import GateReason, StalenessGate, Verdict
from rollbank.staleness.rows import (
    STALENESS_FIELDS,
    GroupMember,
    batch_corrections,
    judge_group,
    row_values,
)

LN2 = math.log(2.0)


def _traj(slot: int, lps: list[float], version: int, *, success: bool) -> Trajectory:
    t = Trajectory(trajectory_id=f"g/s{slot}/r0", group_id="g", task_id="t", attempt=slot)
    t.append_prompt([1, 2])
    t.append_model([3] * len(lps), lps, version)
    t.append_prompt([4])
    reason = Reason.VERIFIED_PASS if success else Reason.VERIFIED_FAIL
    t.outcome = EpisodeOutcome.of(reason, reward=1.0 if success else 0.0)
    return t


def test_judge_group_measures_members_and_keeps_the_rare_success() -> None:
    stale_success = _traj(0, [-1.0, -1.0], 3, success=True)
    fresh_failure = _traj(1, [-0.5, -0.5], 5, success=False)
    unmeasured = _traj(2, [-0.7], 5, success=False)
    members = [
        GroupMember(stale_success, [0.0, 0.0, -1.0 + 0.4, -1.0 - 0.4, 0.0]),
        GroupMember(fresh_failure, [0.0, 0.0, -0.5, -0.5, 0.0], stale_retries=1),
        GroupMember(unmeasured, None),
    ]
    judged = judge_group(StalenessGate(), "g", members, current_version=5)
    d0, d1, d2 = judged.decision.decisions
    assert d0.verdict is Verdict.DOWNWEIGHT and d0.rare_success
    assert d0.k3 == pytest.approx(math.cosh(0.4) - 1) and d0.version_lag == 2
    assert d1.verdict is Verdict.ADMIT and d1.version_lag == 0
    assert d2.reasons == (GateReason.UNMEASURED,)
    assert set(judged.scored) == {"g/s0/r0", "g/s1/r0"}
    assert judged.divergence["g/s2/r0"] is None


def test_batch_corrections_split_rows_and_m2po_is_batch_level() -> None:
    a = _traj(0, [-1.0, -1.0], 3, success=True)
    b = _traj(1, [-1.0], 3, success=False)
    members = [GroupMember(a, [0.0, 0.0, -1.0 + LN2, -1.0 + 0.1, 0.0]),
               GroupMember(b, [0.0, 0.0, -1.0 - 0.2, 0.0])]
    scored = list(judge_group(StalenessGate(), "g", members, 5).scored.values())
    rows, stats = batch_corrections(scored, CorrectionConfig(tis_cap=1.5))
    assert [len(r.weights) for r in rows] == [5, 4]
    np.testing.assert_allclose(rows[0].weights, [0, 0, 1.5, math.exp(0.1), 0])
    np.testing.assert_allclose(rows[1].weights, [0, 0, math.exp(-0.2), 0])
    assert stats["model_tokens"] == 3 and stats["frac_truncated"] == pytest.approx(1 / 3)
    # squares ln2^2=0.48, 0.01, 0.04 over the batch: tau 0.03 keeps 0.01 and 0.04 (mean 0.025)
    m2, _ = batch_corrections(scored, CorrectionConfig(m2po_tau=0.03), CorrectionMode.M2PO)
    assert m2[0].keep.tolist() == [False, False, False, True, False]
    assert m2[1].keep.tolist() == [False, False, True, False]
    empty, st = batch_corrections([], CorrectionConfig())
    assert empty == [] and st["model_tokens"] == 0


def test_row_values_fill_the_proposed_columns() -> None:
    a = _traj(0, [-1.0, -1.0], 3, success=True)
    b = _traj(1, [-1.0], 3, success=False)
    members = [GroupMember(a, [0.0, 0.0, -1.0 + 0.4, -1.4, 0.0]), GroupMember(b, None)]
    judged = judge_group(StalenessGate(), "g", members, 5)
    scored = list(judged.scored.values())
    rows, _ = batch_corrections(scored, CorrectionConfig())
    d0, d1 = judged.decision.decisions
    v0 = row_values(d0, scored=scored[0], correction=rows[0],
                    divergence=judged.divergence["g/s0/r0"], loss_mask=a.loss_mask,
                    scorer_version=5)
    v1 = row_values(d1, scored=None, correction=None, divergence=None,
                    loss_mask=b.loss_mask, scorer_version=5)
    assert v0["is_keep"] == [0, 0, 1, 1, 0]
    assert v0["is_weights"] == pytest.approx([0, 0, math.exp(0.4), math.exp(-0.4), 0], rel=1e-6)
    assert v0["current_logprobs"] == pytest.approx([0, 0, -0.6, -1.4, 0], rel=1e-6)
    assert v0["rare_success"] and v0["gate_verdict"] == "downweight"
    assert v1["current_logprobs"] is None and v1["divergence"] is None
    assert v1["scorer_version"] == -1 and v1["is_weights"] == [0, 0, 1, 0]
    table = pa.Table.from_pylist([v0, v1], schema=pa.schema(list(STALENESS_FIELDS)))
    assert table.column("divergence").to_pylist()[0]["k3"] == pytest.approx(math.cosh(0.4) - 1)
    assert table.column("gate_reasons").to_pylist()[1] == ["unmeasured"]
    # a stale failure is dropped (its slot re-run) and has no batch row
    c = _traj(2, [-1.0, -1.0], 3, success=False)
    retried = judge_group(StalenessGate(), "g", [GroupMember(c, [0.0, 0.0, -0.6, -1.4, 0.0]),
                                                 GroupMember(b, [0.0, 0.0, -1.0, 0.0])], 5)
    d = retried.decision.decisions[0]
    assert d.verdict is Verdict.RETRY and retried.decision.retry_slots == (2,)
    with pytest.raises(ValueError, match="retry"):
        row_values(d, scored=None, correction=None, divergence=None, loss_mask=c.loss_mask,
                   scorer_version=5)
