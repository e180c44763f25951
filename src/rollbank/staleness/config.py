"""Configuration of the staleness layer: estimators, corrections and the divergence gate.

Defaults and where they come from (../shared/reference/off-policy-and-numerics.md):

- Token thresholds 0.1 / 0.5 nats: the |delta log-prob| bands used to report engine/trainer
  mismatch (vLLM bf16 vs HF fp32 measured here: mean 0.019, max 0.085 nats).
- TIS cap C = 2 (Yao et al. 2025; range 1.5-5), sequence TIS cap 5 (verl: 2-10), sequence MIS
  band [0.5, 2] (verl), IcePop band [0.5, 5] (Ring-1T, arXiv 2510.18855), M2PO tau 0.04
  (arXiv 2510.01161).
- Gate: per-token mean k3 of 0.01 is the upper end of verl's k3 rejection range
  (0.001-0.01); the drop level 0.05 is 5x that. For a Gaussian log-rho with std s,
  k3 ~ s^2/2 and the geometric-mean ratio ~ exp(-KL), so the ratio bands [0.99, 1.01] and
  [0.95, 1.05] sit at the same divergence as the k3 levels; the normalised token ESS
  (~exp(-s^2) for Gaussian log-rho) levels 0.8 / 0.5 mainly catch heavy tails that the means
  hide. All of these are starting points to be tuned with ``rollbank bench learning``; none
  of them depends on the version count (the gate never decides by age alone).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from rollbank.config import Section


class EstimatorConfig(Section):
    """What the divergence estimators report besides the fixed moments (k1, k2, k3, chi2, ESS)."""

    abs_log_rho_thresholds: tuple[float, ...] = Field(
        default=(0.1, 0.5),
        description="report the fraction of model tokens with |log rho| above each of these (nats)",
    )
    percentiles: tuple[float, ...] = Field(
        default=(1.0, 5.0, 25.0, 50.0, 75.0, 95.0, 99.0),
        description="log-rho percentiles to report (0-100, linear interpolation)",
    )

    @model_validator(mode="after")
    def _check(self) -> EstimatorConfig:
        if any(t <= 0 for t in self.abs_log_rho_thresholds):
            raise ValueError("abs_log_rho_thresholds must be > 0")
        if any(not 0.0 <= q <= 100.0 for q in self.percentiles):
            raise ValueError("percentiles must be within [0, 100]")
        return self


class CorrectionMode(StrEnum):
    """Which importance correction the batch's ``is_weights`` column carries (and the loss uses)."""

    NONE = "none"  # weights 1 on every model token
    TOKEN_TIS = "token_tis"  # min(rho_t, C)
    SEQ_TIS = "seq_tis"  # min(prod rho, C_seq) on every token of the sequence
    SEQ_MIS = "seq_mis"  # prod rho if it lies in [lo, hi], else the sequence is rejected
    ICEPOP = "icepop"  # rho_t if it lies in [lo, hi], else the token is masked
    M2PO = "m2po"  # weight 1; mask the largest (log rho)^2 tokens until their mean <= tau


class CorrectionConfig(Section):
    """Importance-sampling corrections emitted with a batch."""

    mode: CorrectionMode = Field(
        default=CorrectionMode.TOKEN_TIS,
        description="the correction the trainer's loss applies (the others can still be computed)",
    )
    tis_cap: float = Field(default=2.0, gt=0, description="token TIS cap C: w = min(rho, C)")
    seq_tis_cap: float = Field(
        default=5.0, gt=0, description="sequence TIS cap: w = min(prod rho, cap)"
    )
    seq_mis_low: float = Field(
        default=0.5, gt=0, description="sequence MIS: reject the sequence if prod rho < this"
    )
    seq_mis_high: float = Field(
        default=2.0, gt=0, description="sequence MIS: reject the sequence if prod rho > this"
    )
    icepop_low: float = Field(
        default=0.5, gt=0, description="IcePop: mask a token if rho < this (1/beta_low)"
    )
    icepop_high: float = Field(default=5.0, gt=0, description="IcePop: mask a token if rho > this")
    m2po_tau: float = Field(
        default=0.04,
        gt=0,
        description="M2PO: mask largest (log rho)^2 tokens until their mean over kept tokens <= tau",
    )

    @model_validator(mode="after")
    def _check(self) -> CorrectionConfig:
        if self.seq_mis_low > self.seq_mis_high:
            raise ValueError("seq_mis_low must be <= seq_mis_high")
        if self.icepop_low > self.icepop_high:
            raise ValueError("icepop_low must be <= icepop_high")
        return self


class WeightRule(StrEnum):
    """How the gate weights a trajectory it keeps but does not fully trust."""

    MIN = "min"  # min of the two below: a uniform shift (ESS 1) still lowers the weight
    ESS = "ess"  # the trajectory's normalised token ESS (in (0, 1])
    GEOMETRIC = "geometric"  # min(g, 1/g) for the geometric-mean ratio g = exp(mean log rho)
    FIXED = "fixed"  # GateConfig.fixed_weight


class GateConfig(Section):
    """The staleness gate: admit, down-weight or drop (retry the slot) by measured divergence.

    A trajectory is judged on three per-token statistics of its model tokens: mean k3, the
    normalised ESS of its token ratios and the geometric-mean ratio. Each gives admit /
    down-weight / drop; the most severe wins and every triggered criterion is a reason.
    """

    enabled: bool = Field(default=True, description="false: admit everything (still measured)")
    k3_downweight: float = Field(
        default=0.01, ge=0, description="down-weight when mean per-token k3 exceeds this (nats)"
    )
    k3_drop: float = Field(
        default=0.05, ge=0, description="drop (retry the slot) when mean per-token k3 exceeds this"
    )
    ess_downweight: float = Field(
        default=0.8, gt=0, le=1, description="down-weight when the token ESS falls below this"
    )
    ess_drop: float = Field(
        default=0.5, gt=0, le=1, description="drop when the token ESS falls below this"
    )
    geo_downweight_low: float = Field(
        default=0.99, gt=0, description="down-weight when exp(mean log rho) is below this"
    )
    geo_downweight_high: float = Field(
        default=1.01, gt=0, description="down-weight when exp(mean log rho) is above this"
    )
    geo_drop_low: float = Field(
        default=0.95, gt=0, description="drop when exp(mean log rho) is below this"
    )
    geo_drop_high: float = Field(
        default=1.05, gt=0, description="drop when exp(mean log rho) is above this"
    )
    weight_rule: WeightRule = Field(
        default=WeightRule.MIN, description="the weight of a down-weighted trajectory"
    )
    fixed_weight: float = Field(
        default=0.5, gt=0, le=1, description="the weight when weight_rule is 'fixed'"
    )
    min_weight: float = Field(
        default=0.05, gt=0, le=1, description="floor of any weight the gate gives"
    )
    max_stale_retries: int = Field(
        default=2,
        ge=0,
        description="re-runs of one slot for staleness; then the slot is excluded (like infra_final)",
    )
    keep_rare_success: bool = Field(
        default=True,
        description="keep (down-weighted, flagged) a would-be-dropped trajectory that is the "
        "only successful sibling of its group, instead of retrying it",
    )
    rare_success_min_weight: float = Field(
        default=0.1, gt=0, le=1, description="floor of a kept rare success's weight"
    )
    admit_unmeasured: bool = Field(
        default=True,
        description="a trajectory without current-policy log-probs is admitted (flagged "
        "'unmeasured') if true, else its slot is retried",
    )

    @model_validator(mode="after")
    def _check(self) -> GateConfig:
        if self.k3_downweight > self.k3_drop:
            raise ValueError("k3_downweight must be <= k3_drop")
        if self.ess_drop > self.ess_downweight:
            raise ValueError("ess_drop must be <= ess_downweight")
        if not (self.geo_drop_low <= self.geo_downweight_low <= 1.0
                <= self.geo_downweight_high <= self.geo_drop_high):
            raise ValueError(
                "need geo_drop_low <= geo_downweight_low <= 1 <= geo_downweight_high <= geo_drop_high"
            )
        return self


class CollectionGateConfig(Section):
    """The gate during collection: complete groups are scored against the current policy
    before the ready bank releases them (``rollbank.scheduling.gated_driver``).

    Off by default: with one policy version (``rollbank collect`` without a trainer, or a
    synchronous loop) the divergence is only numerics (~0) and everything is admitted, so
    scoring would spend one extra prefill per trajectory for no decision. Turn it on when
    weights move during collection (async training with ``max_lag`` > 0).
    """

    enabled: bool = Field(
        default=False,
        description="score every complete group with the current policy and gate it before "
        "release (dropped slots are re-run like infra retries); false: no scoring in collection",
    )
    scorer: Literal["engine", "trainer"] = Field(
        default="engine",
        description="who gives the current policy's log-probs: the serving engine's prompt "
        "log-probs (prefill; staleness only, no trainer needed in the collector) or the "
        "trainer's recompute (adds the engine/trainer numerics mismatch) -- docs/staleness.md",
    )
    version_retries: int = Field(
        default=2, ge=0,
        description="engine scorer: score a sequence again when the engine's version changed "
        "during the request (a publication), at most this many times; then it is unmeasured",
    )


class StalenessConfig(Section):
    """Divergence measurement, corrections and the staleness gate (issue #11)."""

    estimators: EstimatorConfig = Field(
        default_factory=EstimatorConfig, description="what the divergence statistics report"
    )
    correction: CorrectionConfig = Field(
        default_factory=CorrectionConfig, description="importance corrections emitted per token"
    )
    gate: GateConfig = Field(default_factory=GateConfig, description="the divergence gate")
    collection: CollectionGateConfig = Field(
        default_factory=CollectionGateConfig,
        description="scoring and gating complete groups during collection (off by default)",
    )
