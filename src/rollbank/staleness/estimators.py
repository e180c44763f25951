"""Divergence between the behaviour policy and the current policy, from sampled tokens only.

Notation (../shared/reference/off-policy-and-numerics.md): ``l_mu`` is the behaviour log-prob
the engine reported for a sampled token (the weight version that sampled it, the engine's
numerics), ``l_pi`` the current policy's log-prob of the same token (trainer recompute or the
current engine scoring the sequence). Per model token (``loss_mask == 1``)::

    log rho = l_pi - l_mu,   rho = exp(log rho)

Estimators of KL(mu || pi) from tokens sampled by mu (Schulman, "Approximating KL
divergence", 2020), all averaged over model tokens:

- ``k1 = mean(-log rho)`` (unbiased, may be negative, high variance)
- ``k2 = mean(0.5 * (log rho)^2)`` (biased, low variance)
- ``k3 = mean(rho - 1 - log rho)`` (unbiased, every term >= 0); ``k3_sum`` is the sum over the
  sequence (chain rule: the sequence-level KL estimate)
- ``chi2 = mean(rho^2) - 1`` (variance gauge of the IS weights; the true chi2 is >= 0 but this
  sample estimate can be slightly negative), ``tv = 0.5 * mean|rho - 1|``
- ``ess = (sum rho)^2 / (n * sum rho^2)``: the normalised effective sample size
  ``1 / mean((w / mean w)^2)`` of the token ratios, in (0, 1]; 1 means all ratios equal
- ``geo_ratio = exp(mean log rho)``: the length-invariant geometric-mean ratio

Numerics: computations are float64; ``rho - 1 - log rho`` is evaluated as
``expm1(x) - x`` (no cancellation for small x) and clamped at 0 against rounding; ESS is
computed in log space (logsumexp), so it never overflows. ``chi2``/``k3`` become ``inf`` when
some log rho exceeds ~709 (rho overflows float64); that is reported, not hidden.

An empty set of model tokens (``n_tokens == 0``) has every divergence 0.0, ESS 1.0 and
percentiles 0.0 by convention; consumers check ``n_tokens``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rollbank.episodes.trajectory import ENV_VERSION, Trajectory
from rollbank.errors import RollbankError
from rollbank.quantiles import interpolated
from rollbank.staleness.config import EstimatorConfig

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
ArrayLike = npt.ArrayLike


class DivergenceInputError(RollbankError, ValueError):
    """Log-probs that cannot be compared: shapes differ or a model token's value is not finite."""


def _f64(a: ArrayLike) -> FloatArray:
    return np.asarray(a, dtype=np.float64)


def model_mask(loss_mask: ArrayLike) -> BoolArray:
    """Boolean mask of model-sampled tokens (``loss_mask != 0``)."""
    return np.asarray(np.asarray(loss_mask) != 0, dtype=np.bool_)


def log_rho(behaviour: ArrayLike, current: ArrayLike, loss_mask: ArrayLike) -> FloatArray:
    """Per-token ``l_pi - l_mu`` on model tokens, 0.0 elsewhere (any shape, all three equal).

    Raises :class:`DivergenceInputError` if shapes differ or a model token's log-prob is not
    finite (the engine layer already rejects non-finite behaviour log-probs; a non-finite
    current log-prob means the scorer is broken, which must not look like zero divergence).
    """
    mu, pi, m = _f64(behaviour), _f64(current), model_mask(loss_mask)
    if not mu.shape == pi.shape == m.shape:
        raise DivergenceInputError(
            f"shapes differ: behaviour {mu.shape}, current {pi.shape}, loss_mask {m.shape}"
        )
    if not (np.isfinite(mu[m]).all() and np.isfinite(pi[m]).all()):
        raise DivergenceInputError("a model token's log-prob is not finite")
    return np.where(m, pi - mu, 0.0)


def k3_terms(lr: ArrayLike) -> FloatArray:
    """Per-token ``rho - 1 - log rho`` (>= 0), elementwise."""
    x = _f64(lr)
    with np.errstate(over="ignore"):
        return np.maximum(np.expm1(x) - x, 0.0)


def _logsumexp(x: FloatArray) -> float:
    m = float(np.max(x))
    return m + math.log(float(np.sum(np.exp(x - m))))


def normalized_ess(log_w: ArrayLike) -> float:
    """``(sum w)^2 / (n sum w^2)`` for weights ``w = exp(log_w)``, in (0, 1]; 1.0 if empty."""
    x = _f64(log_w).ravel()
    if x.size == 0:
        return 1.0
    if not np.isfinite(x).all():
        raise DivergenceInputError("log weights must be finite")
    val = math.exp(2.0 * _logsumexp(x) - math.log(x.size) - _logsumexp(2.0 * x))
    return min(1.0, val)  # Cauchy-Schwarz: <= 1; the clamp removes rounding above 1


def _key(q: float) -> str:
    return f"{q:g}"


@dataclass(frozen=True)
class DivergenceStats:
    """Statistics of a set of model tokens' log rho (one trajectory, or pooled over a batch)."""

    n_tokens: int
    mean_log_rho: float
    geo_ratio: float
    k1: float
    k2: float
    k3: float
    k3_sum: float
    chi2: float
    tv: float
    ess: float
    max_abs_log_rho: float
    percentiles: dict[str, float] = field(default_factory=dict)  # "p50" -> value
    frac_beyond: dict[str, float] = field(default_factory=dict)  # "0.1" -> share of tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def divergence_stats(values: ArrayLike, config: EstimatorConfig | None = None) -> DivergenceStats:
    """Statistics of the log rho of model tokens (``values``: those tokens only, any shape)."""
    cfg = config or EstimatorConfig()
    x = _f64(values).ravel()
    n = int(x.size)
    if n == 0:
        return DivergenceStats(
            n_tokens=0, mean_log_rho=0.0, geo_ratio=1.0, k1=0.0, k2=0.0, k3=0.0, k3_sum=0.0,
            chi2=0.0, tv=0.0, ess=1.0, max_abs_log_rho=0.0,
            percentiles={f"p{_key(q)}": 0.0 for q in cfg.percentiles},
            frac_beyond={_key(t): 0.0 for t in cfg.abs_log_rho_thresholds},
        )
    if not np.isfinite(x).all():
        raise DivergenceInputError("log rho must be finite")
    mean = float(np.mean(x))
    k3 = k3_terms(x)
    with np.errstate(over="ignore"):
        rho = np.exp(x)
        chi2 = float(np.mean(rho * rho)) - 1.0
        tv = 0.5 * float(np.mean(np.abs(np.expm1(x))))
    absx = np.abs(x)
    return DivergenceStats(
        n_tokens=n,
        mean_log_rho=mean,
        geo_ratio=math.exp(mean) if mean < 709.0 else math.inf,
        k1=-mean,
        k2=float(np.mean(0.5 * x * x)),
        k3=float(np.mean(k3)),
        k3_sum=float(np.sum(k3)),
        chi2=chi2,
        tv=tv,
        ess=normalized_ess(x),
        max_abs_log_rho=float(np.max(absx)),
        percentiles={
            f"p{_key(q)}": float(v)
            for q, v in zip(cfg.percentiles, interpolated(x, cfg.percentiles), strict=True)
        },
        frac_beyond={_key(t): float(np.mean(absx > t)) for t in cfg.abs_log_rho_thresholds},
    )


@dataclass(frozen=True)
class ScoredTokens:
    """One trajectory's tokens scored by both policies (1-D arrays of equal length)."""

    trajectory_id: str
    behaviour: FloatArray  # l_mu per token (0.0 on prompt/env tokens)
    current: FloatArray  # l_pi per token (ignored on prompt/env tokens)
    loss_mask: BoolArray
    policy_versions: IntArray  # version that sampled each token (-1 on prompt/env)

    @classmethod
    def from_trajectory(cls, traj: Trajectory, current: ArrayLike) -> ScoredTokens:
        """``current``: the current policy's log-prob of every token of ``traj`` (same length)."""
        return cls.build(traj.trajectory_id, traj.logprobs, current, traj.loss_mask,
                         traj.policy_versions)

    @classmethod
    def build(cls, trajectory_id: str, behaviour: ArrayLike, current: ArrayLike,
              loss_mask: ArrayLike, policy_versions: ArrayLike) -> ScoredTokens:
        mu, pi, m = _f64(behaviour), _f64(current), model_mask(loss_mask)
        v = np.asarray(policy_versions, dtype=np.int64)
        if not (mu.ndim == 1 and mu.shape == pi.shape == m.shape == v.shape):
            raise DivergenceInputError(
                f"{trajectory_id}: per-token arrays must be 1-D of equal length "
                f"(behaviour {mu.shape}, current {pi.shape}, mask {m.shape}, versions {v.shape})"
            )
        log_rho(mu, pi, m)  # validates finiteness on model tokens
        return cls(trajectory_id, mu, pi, m, v)

    def log_rho(self) -> FloatArray:
        """log rho of the model tokens only (length ``n_tokens``)."""
        return (self.current - self.behaviour)[self.loss_mask]

    def lags(self, current_version: int) -> IntArray:
        """``current_version - version`` of each model token with a known version."""
        v = self.policy_versions[self.loss_mask]
        return np.asarray(current_version - v[v != ENV_VERSION], dtype=np.int64)


def scored_rows(
    trajectory_ids: Sequence[str], behaviour: ArrayLike, current: ArrayLike,
    loss_mask: ArrayLike, policy_versions: ArrayLike,
) -> list[ScoredTokens]:
    """Rows of right-padded ``[B, T]`` arrays (the loader's layout: padding has mask 0 and
    version -1) as :class:`ScoredTokens`, e.g. behaviour = ``TensorBatch.old_logprobs`` and
    current = the trainer's recompute, both ``.numpy()``."""
    mu, pi = _f64(behaviour), _f64(current)
    m, v = model_mask(loss_mask), np.asarray(policy_versions, dtype=np.int64)
    if not (mu.ndim == 2 and mu.shape == pi.shape == m.shape == v.shape
            and mu.shape[0] == len(trajectory_ids)):
        raise DivergenceInputError(
            f"need [B, T] arrays for {len(trajectory_ids)} ids: behaviour {mu.shape}, "
            f"current {pi.shape}, mask {m.shape}, versions {v.shape}"
        )
    return [ScoredTokens.build(t, mu[i], pi[i], m[i], v[i]) for i, t in enumerate(trajectory_ids)]


def trajectory_divergence(
    scored: ScoredTokens, config: EstimatorConfig | None = None
) -> DivergenceStats:
    return divergence_stats(scored.log_rho(), config)


def version_lag_histogram(scored: Iterable[ScoredTokens], current_version: int) -> dict[int, int]:
    """``{lag: model token count}`` sorted by lag (same definition as batching.stats)."""
    hist: Counter[int] = Counter()
    for s in scored:
        hist.update(int(x) for x in s.lags(current_version))
    return dict(sorted(hist.items()))


def k3_by_lag(scored: Iterable[ScoredTokens], current_version: int) -> dict[int, float]:
    """Mean per-token k3 of model tokens grouped by version lag (fresh tokens should be ~0)."""
    sums: defaultdict[int, float] = defaultdict(float)
    counts: Counter[int] = Counter()
    for s in scored:
        v = s.policy_versions[s.loss_mask]
        known = v != ENV_VERSION
        terms = k3_terms(s.log_rho()[known])
        for lag, t in zip((current_version - v[known]).tolist(), terms.tolist(), strict=True):
            sums[lag] += t
            counts[lag] += 1
    return {lag: sums[lag] / counts[lag] for lag in sorted(counts)}


@dataclass(frozen=True)
class BatchDivergence:
    """Divergence of a batch: pooled token statistics, per-trajectory spread, lag views."""

    trajectories: int
    tokens: DivergenceStats  # pooled over every model token of the batch
    seq_ess: float  # normalised ESS of the sequence weights prod(rho) over trajectories
    traj_k3_mean: float  # mean over trajectories of their per-token mean k3
    traj_k3_max: float
    traj_k3_sum_mean: float  # mean sequence-level k3 (sum over each trajectory's tokens)
    traj_ess_min: float
    version_lag_histogram: dict[int, int]
    k3_by_lag: dict[int, float]
    per_trajectory: dict[str, DivergenceStats]

    def to_dict(self, *, per_trajectory: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "trajectories": self.trajectories,
            "tokens": self.tokens.to_dict(),
            "seq_ess": self.seq_ess,
            "traj_k3_mean": self.traj_k3_mean,
            "traj_k3_max": self.traj_k3_max,
            "traj_k3_sum_mean": self.traj_k3_sum_mean,
            "traj_ess_min": self.traj_ess_min,
            "version_lag_histogram": {str(k): v for k, v in self.version_lag_histogram.items()},
            "k3_by_lag": {str(k): v for k, v in self.k3_by_lag.items()},
        }
        if per_trajectory:
            out["per_trajectory"] = {k: v.to_dict() for k, v in self.per_trajectory.items()}
        return out


def batch_divergence(
    scored: Sequence[ScoredTokens], current_version: int, config: EstimatorConfig | None = None
) -> BatchDivergence:
    """Per-trajectory and batch statistics; ``current_version`` is the scoring policy's version."""
    per = {s.trajectory_id: trajectory_divergence(s, config) for s in scored}
    if len(per) != len(scored):
        raise DivergenceInputError("trajectory ids in a batch must be unique")
    lrs = [s.log_rho() for s in scored]
    pooled = np.concatenate(lrs) if lrs else np.zeros(0)
    measured = [d for d in per.values() if d.n_tokens > 0]
    seq_log_w = np.array([float(np.sum(x)) for x in lrs if x.size > 0])
    return BatchDivergence(
        trajectories=len(scored),
        tokens=divergence_stats(pooled, config),
        seq_ess=normalized_ess(seq_log_w),
        traj_k3_mean=float(np.mean([d.k3 for d in measured])) if measured else 0.0,
        traj_k3_max=max((d.k3 for d in measured), default=0.0),
        traj_k3_sum_mean=float(np.mean([d.k3_sum for d in measured])) if measured else 0.0,
        traj_ess_min=min((d.ess for d in measured), default=1.0),
        version_lag_histogram=version_lag_histogram(scored, current_version),
        k3_by_lag=k3_by_lag(scored, current_version),
        per_trajectory=per,
    )
