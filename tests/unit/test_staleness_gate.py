"""The staleness gate: admit / down-weight / drop (retry) / exclude / rare success; report."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.staleness.config import GateConfig, StalenessConfig, WeightRule
from rollbank.staleness.corrections import token_tis
from rollbank.staleness.estimators import (
    DivergenceStats,
    ScoredTokens,
    batch_divergence,
    divergence_stats,
)
from rollbank.staleness.gate import (
    GateCounters,
    GateDecision,
    GateInput,
    GateReason,
    StalenessGate,
    Verdict,
)
from rollbank.staleness.report import prometheus_samples, staleness_report

FRESH = divergence_stats([0.0] * 8)
# symmetric +-a: mean log rho 0 (geo 1), k3 = cosh(a) - 1, ESS = cosh(a)^2 / cosh(2a)
MILD = divergence_stats([0.2, -0.2] * 4)  # k3 0.0201 -> down-weight on k3 only
STALE = divergence_stats([0.4, -0.4] * 4)  # k3 0.0811 -> drop on k3 only
SHIFTED = divergence_stats([-0.02] * 8)  # geo 0.980 -> down-weight on the ratio only


def _stats(**kw: float) -> DivergenceStats:
    """FRESH with some fields replaced: isolates one criterion."""
    return replace(FRESH, **kw)  # type: ignore[arg-type]


def _inp(d: DivergenceStats | None, slot: int = 0, success: bool = False, retries: int = 0,
         lag: int = 0) -> GateInput:
    return GateInput(f"g/s{slot}", slot, success, d, stale_retries=retries, version_lag=lag)


def test_hand_values_of_the_fixtures() -> None:
    assert MILD.k3 == pytest.approx(math.cosh(0.2) - 1)
    assert MILD.ess == pytest.approx(math.cosh(0.2) ** 2 / math.cosh(0.4))
    assert STALE.k3 == pytest.approx(math.cosh(0.4) - 1)
    assert SHIFTED.geo_ratio == pytest.approx(math.exp(-0.02))


def test_fresh_trajectory_is_admitted_with_weight_one() -> None:
    d = StalenessGate().decide(_inp(FRESH))
    assert (d.verdict, d.weight, d.reasons) == (Verdict.ADMIT, 1.0, (GateReason.WITHIN,))
    assert d.keep and d.k3 == 0.0 and d.ess == 1.0


def test_moderate_k3_is_down_weighted_by_min_of_ess_and_ratio() -> None:
    d = StalenessGate().decide(_inp(MILD))
    assert d.verdict is Verdict.DOWNWEIGHT and d.reasons == (GateReason.K3,)
    assert d.weight == pytest.approx(math.cosh(0.2) ** 2 / math.cosh(0.4))  # ESS < geo 1


def test_uniform_shift_is_down_weighted_by_the_geometric_ratio() -> None:
    d = StalenessGate().decide(_inp(SHIFTED))
    assert d.verdict is Verdict.DOWNWEIGHT and d.reasons == (GateReason.GEO,)
    assert d.weight == pytest.approx(math.exp(-0.02))  # ESS is 1 for a uniform shift


def test_each_criterion_alone_triggers_its_level() -> None:
    gate = StalenessGate()
    cases = [
        (_stats(k3=0.02), Verdict.DOWNWEIGHT, (GateReason.K3,)),
        (_stats(k3=0.06), Verdict.RETRY, (GateReason.K3,)),
        (_stats(ess=0.7), Verdict.DOWNWEIGHT, (GateReason.ESS,)),
        (_stats(ess=0.4), Verdict.RETRY, (GateReason.ESS,)),
        (_stats(geo_ratio=1.02), Verdict.DOWNWEIGHT, (GateReason.GEO,)),
        (_stats(geo_ratio=0.94), Verdict.RETRY, (GateReason.GEO,)),
        (_stats(k3=0.02, ess=0.4, geo_ratio=1.02), Verdict.RETRY,
         (GateReason.K3, GateReason.ESS, GateReason.GEO)),
        (_stats(k3=math.inf), Verdict.RETRY, (GateReason.K3,)),
        (_stats(geo_ratio=math.inf), Verdict.RETRY, (GateReason.GEO,)),
    ]
    for stats, verdict, reasons in cases:
        d = gate.decide(_inp(stats))
        assert (d.verdict, d.reasons) == (verdict, reasons), stats
        assert d.weight == (0.0 if verdict is Verdict.RETRY else d.weight)


def test_stale_trajectory_is_retried_then_excluded_when_retries_are_spent() -> None:
    gate = StalenessGate(GateConfig(max_stale_retries=2))
    assert gate.decide(_inp(STALE, retries=0)).verdict is Verdict.RETRY
    assert gate.decide(_inp(STALE, retries=1)).verdict is Verdict.RETRY
    d = gate.decide(_inp(STALE, retries=2))
    assert d.verdict is Verdict.EXCLUDE and not d.keep and d.weight == 0.0
    assert d.reasons == (GateReason.K3, GateReason.RETRIES_SPENT)


def test_version_lag_alone_never_decides() -> None:
    gate = StalenessGate()
    old_but_same = gate.decide(_inp(FRESH, lag=1000))
    assert old_but_same.verdict is Verdict.ADMIT and old_but_same.version_lag == 1000
    # a lag-0 trajectory whose numerics diverge is not protected by being fresh
    assert gate.decide(_inp(STALE, lag=0)).verdict is Verdict.RETRY


def test_rare_success_is_kept_with_a_weight_and_flagged() -> None:
    gate = StalenessGate()
    g = gate.decide_group("g", [
        _inp(STALE, slot=0, success=True), _inp(FRESH, slot=1), _inp(STALE, slot=2),
    ])
    rare, fresh, failure = g.decisions
    assert rare.verdict is Verdict.DOWNWEIGHT and rare.rare_success
    assert rare.reasons == (GateReason.K3, GateReason.RARE_SUCCESS)
    assert rare.weight == pytest.approx(STALE.ess)  # above the 0.1 floor
    assert fresh.verdict is Verdict.ADMIT
    assert failure.verdict is Verdict.RETRY and not failure.rare_success
    assert g.retry_slots == (2,) and not g.settled
    assert [d.slot for d in g.kept] == [0, 1]


def test_rare_success_weight_is_floored() -> None:
    very = _stats(k3=5.0, ess=0.01)
    gate = StalenessGate(GateConfig(rare_success_min_weight=0.1, min_weight=0.05))
    g = gate.decide_group("g", [_inp(very, 0, success=True), _inp(FRESH, 1)])
    assert g.decisions[0].weight == pytest.approx(0.1)
    assert gate.weight_of(very) == pytest.approx(0.05)


def test_not_rare_when_two_succeed_or_alone_or_disabled() -> None:
    two = StalenessGate().decide_group("g", [
        _inp(STALE, 0, success=True), _inp(FRESH, 1, success=True), _inp(FRESH, 2),
    ])
    assert two.decisions[0].verdict is Verdict.RETRY
    alone = StalenessGate().decide_group("g", [_inp(STALE, 0, success=True)])
    assert alone.decisions[0].verdict is Verdict.RETRY
    off = StalenessGate(GateConfig(keep_rare_success=False)).decide_group(
        "g", [_inp(STALE, 0, success=True), _inp(FRESH, 1)])
    assert off.decisions[0].verdict is Verdict.RETRY
    # a rare success after its retries are spent is still kept
    spent = StalenessGate().decide_group(
        "g", [_inp(STALE, 0, success=True, retries=5), _inp(FRESH, 1)])
    assert spent.decisions[0].verdict is Verdict.DOWNWEIGHT and spent.decisions[0].rare_success


def test_unmeasured_no_tokens_and_disabled() -> None:
    assert StalenessGate().decide(_inp(None)).reasons == (GateReason.UNMEASURED,)
    assert StalenessGate().decide(_inp(None)).verdict is Verdict.ADMIT
    strict = StalenessGate(GateConfig(admit_unmeasured=False))
    g = strict.decide_group("g", [_inp(None, 0, success=True), _inp(FRESH, 1)])
    assert g.decisions[0].verdict is Verdict.RETRY  # no rare-success exemption when unmeasured
    none = StalenessGate().decide(_inp(divergence_stats([])))
    assert (none.verdict, none.reasons) == (Verdict.ADMIT, (GateReason.NO_MODEL_TOKENS,))
    off = StalenessGate(GateConfig(enabled=False)).decide(_inp(STALE))
    assert (off.verdict, off.weight, off.reasons) == (Verdict.ADMIT, 1.0, (GateReason.DISABLED,))


def test_weight_rules() -> None:
    d = _stats(ess=0.7, geo_ratio=1.25)
    w = {r: StalenessGate(GateConfig(weight_rule=r, fixed_weight=0.3)).weight_of(d)
         for r in WeightRule}
    assert w == pytest.approx({WeightRule.MIN: 0.7, WeightRule.ESS: 0.7,
                               WeightRule.GEOMETRIC: 0.8, WeightRule.FIXED: 0.3})


def test_group_with_duplicate_slots_is_an_error() -> None:
    with pytest.raises(ValueError, match="slot"):
        StalenessGate().decide_group("g", [_inp(FRESH, 0), _inp(FRESH, 0)])


def test_config_validation() -> None:
    with pytest.raises(ValidationError):
        GateConfig(k3_downweight=0.1, k3_drop=0.05)
    with pytest.raises(ValidationError):
        GateConfig(ess_downweight=0.4, ess_drop=0.5)
    with pytest.raises(ValidationError):
        GateConfig(geo_downweight_low=0.9, geo_drop_low=0.95)
    with pytest.raises(ValidationError):
        StalenessConfig.model_validate({"gate": {"k3_dorp": 1}})
    for model in (GateConfig, StalenessConfig):
        assert all(f.description for f in model.model_fields.values())


def test_gate_input_from_trajectory() -> None:
    t = Trajectory(trajectory_id="g/s1/r0", group_id="g", task_id="t", attempt=1)
    t.append_prompt([1])
    t.append_model([2, 3], [-0.1, -0.2], [3, 4])
    t.outcome = EpisodeOutcome.of(Reason.VERIFIED_PASS, reward=1.0)
    inp = GateInput.from_trajectory(t, FRESH, current_version=6, stale_retries=1)
    assert (inp.slot, inp.success, inp.version_lag, inp.stale_retries) == (1, True, 3, 1)
    t.outcome = EpisodeOutcome.of(Reason.VERIFIED_FAIL, reward=0.0)
    assert not GateInput.from_trajectory(t, FRESH, 6).success


def test_counters_and_report() -> None:
    gate = StalenessGate()
    g1 = gate.decide_group("g1", [_inp(STALE, 0, success=True), _inp(MILD, 1), _inp(FRESH, 2)])
    g2 = gate.decide_group("g2", [_inp(STALE, 0), _inp(None, 1)])
    counters = GateCounters()
    counters.add_group(g1)
    counters.add_group(g2)
    c = counters.to_dict()
    assert (c["trajectories"], c["admitted"], c["downweighted"], c["retried"]) == (5, 2, 2, 1)
    assert (c["rare_success_kept"], c["unmeasured"], c["groups"], c["groups_with_retry"]) == (
        1, 1, 2, 1)
    assert c["reasons"]["k3"] == 3
    decisions: list[GateDecision] = [*g1.decisions, *g2.decisions]
    scored = [ScoredTokens.build("g1/s0", [-1.0, -1.0], [-0.6, -1.4], [1, 1], [0, 0])]
    bd = batch_divergence(scored, current_version=2)
    corr = token_tis([[0.4, -0.4]], [[1, 1]], 2.0).stats([[1, 1]])
    rep = staleness_report(bd, decisions, correction=corr, current_version=2,
                           scorer="trainer_recompute")
    json.dumps(rep)  # JSON-ready
    # counted from the decisions when no counters are passed (which know no groups)
    assert rep["gate"] == {**c, "groups": 0, "groups_with_retry": 0}
    assert staleness_report(bd, decisions, counters=counters)["gate"] == c
    assert rep["rare_success"] == ["g/s0"]
    assert [x["verdict"] for x in rep["dropped"]] == ["retry"]
    assert len(rep["downweighted"]) == 2
    kept_w = [d.weight for d in decisions if d.keep]
    assert rep["weight_mean"] == pytest.approx(sum(kept_w) / len(kept_w))
    samples = prometheus_samples(rep)
    assert samples["rollbank_staleness_gate_retried"] == 1.0
    assert samples["rollbank_staleness_divergence_tokens_k3"] == pytest.approx(math.cosh(0.4) - 1)
    assert samples["rollbank_staleness_divergence_version_lag_histogram_2"] == 2.0
    assert samples["rollbank_staleness_divergence_tokens_frac_beyond_0_1"] == 1.0
    assert samples["rollbank_staleness_correction_weight_max"] == pytest.approx(math.exp(0.4))
    assert "rollbank_staleness_scorer" not in samples
    assert staleness_report(None)["divergence"] is None


# ---------------------------------------------------------------- properties
stats_st = st.builds(
    lambda k3, ess, geo, n: replace(FRESH, k3=k3, ess=ess, geo_ratio=geo, n_tokens=n),
    st.floats(min_value=0.0, max_value=10.0), st.floats(min_value=1e-6, max_value=1.0),
    st.floats(min_value=1e-3, max_value=1e3), st.integers(0, 100),
)


@settings(max_examples=300, deadline=None)
@given(stats_st, st.booleans(), st.booleans(), st.integers(0, 4), st.integers(0, 1000))
def test_property_weights_and_verdicts_are_consistent(
    d: DivergenceStats, success: bool, only: bool, retries: int, lag: int
) -> None:
    cfg = GateConfig()
    gate = StalenessGate(cfg)
    dec = gate.decide(_inp(d, success=success, retries=retries, lag=lag), only_success=only)
    if dec.keep:
        assert cfg.min_weight <= dec.weight <= 1.0
        assert (dec.weight == 1.0) or dec.verdict is Verdict.DOWNWEIGHT
    else:
        assert dec.weight == 0.0
    assert dec.rare_success == (GateReason.RARE_SUCCESS in dec.reasons)
    assert not dec.rare_success or (success and only)
    # the version lag never changes the verdict or the weight
    same = gate.decide(_inp(d, success=success, retries=retries, lag=0), only_success=only)
    assert (same.verdict, same.weight, same.reasons) == (dec.verdict, dec.weight, dec.reasons)
