"""The staleness gate: a pure policy that judges trajectories by measured divergence.

Input per trajectory: its :class:`~rollbank.staleness.estimators.DivergenceStats` (behaviour
vs current policy over its model tokens), whether it succeeded, how many times its slot was
already re-run for staleness, and its version lag (recorded, never decisive). Output: a
:class:`GateDecision` per trajectory, as data. No I/O and no time: the decision depends only
on its inputs and the :class:`~rollbank.staleness.config.GateConfig`.

Rules
- Each of three criteria gives admit / down-weight / drop: mean per-token k3 (above
  ``k3_downweight`` / ``k3_drop``), normalised token ESS (below ``ess_downweight`` /
  ``ess_drop``), geometric-mean ratio ``exp(mean log rho)`` (outside the down-weight / drop
  bands). The most severe wins; every triggered criterion is listed in ``reasons``.
- Down-weight: ``weight = clamp(rule, min_weight, 1)`` with the configured
  :class:`~rollbank.staleness.config.WeightRule` (default: ``min(ESS, min(g, 1/g))`` with
  ``g`` the geometric-mean ratio).
- Drop: the attempt is discarded and its slot re-run with the current policy (verdict
  ``retry``), exactly like an infra retry, so the group stays complete and its baseline is
  not biased toward the siblings that happened to be fresh. After ``max_stale_retries``
  re-runs of the slot the verdict is ``exclude``: the slot leaves the group like an
  ``infra_final`` attempt.
- Rare success: a would-be-dropped trajectory that is the only successful sibling of its group
  (group of at least two) is kept, ``weight = max(rule, rare_success_min_weight, min_weight)``,
  flagged ``rare_success`` so the batch can report the choice (``keep_rare_success``).
- Unmeasured (no current-policy log-probs): admitted and flagged if ``admit_unmeasured``, else
  dropped (retry / exclude) without the rare-success exemption: an operator who asked for
  "never train on unmeasured" gets exactly that.
- No model tokens: nothing to measure; admitted with weight 1.
- Version lag alone never changes a verdict.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Any

from rollbank.episodes.outcome import Outcome
from rollbank.episodes.trajectory import ENV_VERSION, Trajectory
from rollbank.staleness.config import GateConfig, WeightRule
from rollbank.staleness.estimators import DivergenceStats


class Verdict(StrEnum):
    ADMIT = "admit"  # train on it with weight 1
    DOWNWEIGHT = "downweight"  # train on it with weight < 1
    RETRY = "retry"  # discard this attempt; re-run its slot (like an infra retry)
    EXCLUDE = "exclude"  # discard; the slot's staleness retries are spent (like infra_final)


class GateReason(StrEnum):
    WITHIN = "within_thresholds"
    K3 = "k3"
    ESS = "ess"
    GEO = "geo_ratio"
    UNMEASURED = "unmeasured"
    NO_MODEL_TOKENS = "no_model_tokens"
    RARE_SUCCESS = "rare_success"
    RETRIES_SPENT = "stale_retries_spent"
    DISABLED = "gate_disabled"


class _Severity(IntEnum):
    ADMIT = 0
    DOWNWEIGHT = 1
    DROP = 2


@dataclass(frozen=True)
class GateInput:
    """What the gate needs about one trajectory (a valid sibling of its group)."""

    trajectory_id: str
    slot: int
    success: bool
    divergence: DivergenceStats | None  # None: no current-policy log-probs were obtained
    stale_retries: int = 0  # re-runs of this slot already caused by the gate
    version_lag: int = 0  # current version - oldest version of its model tokens (recorded only)

    @classmethod
    def from_trajectory(
        cls, traj: Trajectory, divergence: DivergenceStats | None, current_version: int,
        stale_retries: int = 0,
    ) -> GateInput:
        success = traj.outcome is not None and traj.outcome.outcome is Outcome.MODEL_SUCCESS
        oldest = traj.min_version
        lag = current_version - oldest if oldest != ENV_VERSION else 0
        return cls(traj.trajectory_id, traj.attempt, success, divergence, stale_retries, lag)


@dataclass(frozen=True)
class GateDecision:
    trajectory_id: str
    slot: int
    verdict: Verdict
    weight: float  # 0.0 unless kept
    reasons: tuple[GateReason, ...]
    rare_success: bool = False
    k3: float | None = None
    ess: float | None = None
    geo_ratio: float | None = None
    version_lag: int = 0

    @property
    def keep(self) -> bool:
        return self.verdict in (Verdict.ADMIT, Verdict.DOWNWEIGHT)

    def to_dict(self) -> dict[str, Any]:
        return {
            "trajectory_id": self.trajectory_id, "slot": self.slot,
            "verdict": self.verdict.value, "weight": self.weight,
            "reasons": [r.value for r in self.reasons], "rare_success": self.rare_success,
            "k3": self.k3, "ess": self.ess, "geo_ratio": self.geo_ratio,
            "version_lag": self.version_lag,
        }


@dataclass(frozen=True)
class GroupGateDecision:
    """The gate's decisions for every valid sibling of one group."""

    group_id: str
    decisions: tuple[GateDecision, ...]

    @property
    def retry_slots(self) -> tuple[int, ...]:
        return tuple(d.slot for d in self.decisions if d.verdict is Verdict.RETRY)

    @property
    def excluded_slots(self) -> tuple[int, ...]:
        return tuple(d.slot for d in self.decisions if d.verdict is Verdict.EXCLUDE)

    @property
    def kept(self) -> tuple[GateDecision, ...]:
        return tuple(d for d in self.decisions if d.keep)

    @property
    def settled(self) -> bool:
        """No slot needs a re-run: the group may complete with ``kept`` as its valid siblings."""
        return not self.retry_slots


@dataclass
class GateCounters:
    """Running counts of gate decisions, for the batch report and Prometheus."""

    trajectories: int = 0
    admitted: int = 0
    downweighted: int = 0
    retried: int = 0
    excluded: int = 0
    rare_success_kept: int = 0
    unmeasured: int = 0
    groups: int = 0
    groups_with_retry: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def add(self, d: GateDecision) -> None:
        self.trajectories += 1
        match d.verdict:
            case Verdict.ADMIT:
                self.admitted += 1
            case Verdict.DOWNWEIGHT:
                self.downweighted += 1
            case Verdict.RETRY:
                self.retried += 1
            case Verdict.EXCLUDE:
                self.excluded += 1
        self.rare_success_kept += d.rare_success
        self.unmeasured += GateReason.UNMEASURED in d.reasons
        self.reasons.update(r.value for r in d.reasons)

    def add_group(self, g: GroupGateDecision) -> None:
        self.groups += 1
        self.groups_with_retry += bool(g.retry_slots)
        for d in g.decisions:
            self.add(d)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: v for k, v in self.__dict__.items() if k != "reasons"}
        out["reasons"] = dict(sorted(self.reasons.items()))
        return out


class StalenessGate:
    """Pure: ``decide`` / ``decide_group`` map inputs to decisions; no state besides config."""

    def __init__(self, config: GateConfig | None = None) -> None:
        self.config = config or GateConfig()

    # ------------------------------------------------------------ criteria
    def _judge(self, d: DivergenceStats) -> tuple[_Severity, tuple[GateReason, ...]]:
        c = self.config
        found: list[tuple[_Severity, GateReason]] = []
        k3 = d.k3 if not math.isnan(d.k3) else math.inf
        if k3 > c.k3_drop:
            found.append((_Severity.DROP, GateReason.K3))
        elif k3 > c.k3_downweight:
            found.append((_Severity.DOWNWEIGHT, GateReason.K3))
        if d.ess < c.ess_drop:
            found.append((_Severity.DROP, GateReason.ESS))
        elif d.ess < c.ess_downweight:
            found.append((_Severity.DOWNWEIGHT, GateReason.ESS))
        g = d.geo_ratio
        if not c.geo_drop_low <= g <= c.geo_drop_high:
            found.append((_Severity.DROP, GateReason.GEO))
        elif not c.geo_downweight_low <= g <= c.geo_downweight_high:
            found.append((_Severity.DOWNWEIGHT, GateReason.GEO))
        if not found:
            return _Severity.ADMIT, (GateReason.WITHIN,)
        return max(s for s, _ in found), tuple(r for _, r in found)

    def weight_of(self, d: DivergenceStats) -> float:
        """The down-weight for ``d`` by the configured rule, clamped to [min_weight, 1]."""
        c = self.config
        g = d.geo_ratio
        geo = min(g, 1.0 / g) if 0.0 < g < math.inf else 0.0
        match c.weight_rule:
            case WeightRule.MIN:
                w = min(d.ess, geo)
            case WeightRule.ESS:
                w = d.ess
            case WeightRule.GEOMETRIC:
                w = geo
            case WeightRule.FIXED:
                w = c.fixed_weight
        return max(c.min_weight, min(1.0, w))

    # ------------------------------------------------------------ decisions
    def decide(self, inp: GateInput, *, only_success: bool = False) -> GateDecision:
        """Decide one trajectory; ``only_success``: it is the only successful sibling of its
        group (see :meth:`decide_group`, which works this out)."""
        c = self.config
        d = inp.divergence

        def out(verdict: Verdict, weight: float, reasons: tuple[GateReason, ...],
                rare: bool = False) -> GateDecision:
            return GateDecision(
                inp.trajectory_id, inp.slot, verdict, weight, reasons, rare,
                k3=d.k3 if d else None, ess=d.ess if d else None,
                geo_ratio=d.geo_ratio if d else None, version_lag=inp.version_lag,
            )

        if not c.enabled:
            return out(Verdict.ADMIT, 1.0, (GateReason.DISABLED,))
        if d is None:
            if c.admit_unmeasured:
                return out(Verdict.ADMIT, 1.0, (GateReason.UNMEASURED,))
            return self._drop(inp, (GateReason.UNMEASURED,), out)
        if d.n_tokens == 0:
            return out(Verdict.ADMIT, 1.0, (GateReason.NO_MODEL_TOKENS,))
        severity, reasons = self._judge(d)
        if severity is _Severity.ADMIT:
            return out(Verdict.ADMIT, 1.0, reasons)
        weight = self.weight_of(d)
        if severity is _Severity.DOWNWEIGHT:
            return out(Verdict.DOWNWEIGHT, weight, reasons)
        if c.keep_rare_success and only_success and inp.success:
            w = max(weight, c.rare_success_min_weight)
            return out(Verdict.DOWNWEIGHT, w, (*reasons, GateReason.RARE_SUCCESS), rare=True)
        return self._drop(inp, reasons, out)

    def _drop(self, inp: GateInput, reasons: tuple[GateReason, ...], out: Any) -> GateDecision:
        if inp.stale_retries < self.config.max_stale_retries:
            decision: GateDecision = out(Verdict.RETRY, 0.0, reasons)
        else:
            decision = out(Verdict.EXCLUDE, 0.0, (*reasons, GateReason.RETRIES_SPENT))
        return decision

    def decide_group(self, group_id: str, inputs: Sequence[GateInput]) -> GroupGateDecision:
        """Decide every valid sibling of a group (all slots terminal), in the given order.

        A success is "rare" when it is the only success among ``inputs`` and the group has
        at least two valid siblings.
        """
        slots = [i.slot for i in inputs]
        if len(set(slots)) != len(slots):
            raise ValueError(f"group {group_id}: two inputs for one slot")
        successes = sum(1 for i in inputs if i.success)
        only = successes == 1 and len(inputs) >= 2
        return GroupGateDecision(
            group_id, tuple(self.decide(i, only_success=only) for i in inputs)
        )
