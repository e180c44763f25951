"""Per-batch metrics: time to trainable batch, tail share, throughput, utilisation, T_LB.

Everything is computed from finished :class:`Trajectory` records and the spans the runner put
in them (``episodes/spans.py``); nothing is sampled from a live system, so a summary can be
recomputed from a batch directory or an episode folder after the fact.

Definitions (window = [t_start, t_end], t_start = the previous batch's hand-off or the first
launch, t_end = this batch's hand-off)
- time_to_batch_s = t_end - t_start.
- tail_share = (T100 - T90) / T100 over the accepted trajectories' finish times (from t_start);
  T90 is the nearest-rank quantile of :mod:`rollbank.quantiles`.
- inference_busy_s: per server, the union of its inference spans in the window, summed.
- inference_idle_env_s: per server, time in the window it had nothing in flight while some
  episode was in an environment phase (set-up, tool, verify), summed: the "GPU waiting on the
  cheapest container" time.
- sandbox_held_util = sandbox-held seconds in the window / (S * T); sandbox_exec_util counts
  only seconds with a command running.
- prefix_cache_hit_rate = cached / sent prompt tokens over inference spans in the window, when
  the servers report cache hits (else None).
- accepted vs pool: mean turns, duration, model tokens and reward of the accepted trajectories
  against every trajectory that finished in the window (selection bias made visible).
- staleness: the batch's staleness report (``rollbank.staleness.report.staleness_report``:
  k1, k3, chi2, ESS, log-rho percentiles, shares beyond the |log rho| thresholds, version-lag
  histogram, k3 by lag, gate counts, correction statistics) when the batch was measured, else
  None; :func:`staleness_scalars` flattens it for scalar sinks.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from rollbank.episodes.spans import Span, spans_of
from rollbank.episodes.trajectory import Trajectory
from rollbank.metrics.bound import Capacity, lower_bound
from rollbank.quantiles import quantile
from rollbank.staleness.report import prometheus_samples

Interval = tuple[float, float]


def union(intervals: Iterable[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def measure(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in union(intervals))


def clip(intervals: Iterable[Interval], lo: float, hi: float) -> list[Interval]:
    return [(max(a, lo), min(b, hi)) for a, b in intervals if min(b, hi) > max(a, lo)]


def subtract(base: Sequence[Interval], cut: Sequence[Interval]) -> list[Interval]:
    """``base`` minus ``cut`` (both unions)."""
    out: list[Interval] = []
    for a, b in union(base):
        cur = a
        for c, d in union(cut):
            if d <= cur or c >= b:
                continue
            if c > cur:
                out.append((cur, c))
            cur = max(cur, d)
        if cur < b:
            out.append((cur, b))
    return out


@dataclass(frozen=True)
class Profile:
    n: int
    mean_turns: float
    mean_duration_s: float
    mean_model_tokens: float
    mean_reward: float | None

    @classmethod
    def of(cls, trajs: Sequence[Trajectory]) -> Profile:
        if not trajs:
            return cls(0, 0.0, 0.0, 0.0, None)
        rewards = [t.reward for t in trajs if t.reward is not None]
        return cls(
            len(trajs),
            statistics.fmean(len(t.steps) for t in trajs),
            statistics.fmean(t.duration_s for t in trajs),
            statistics.fmean(t.num_model_tokens for t in trajs),
            statistics.fmean(rewards) if rewards else None,
        )


@dataclass(frozen=True)
class BatchSummary:
    batch_index: int
    t_start: float
    t_end: float
    n_trajectories: int
    n_groups: int
    time_to_batch_s: float
    t90_s: float
    t100_s: float
    tail_share: float
    model_tokens: int
    tokens_per_s: float
    inference_busy_s: float
    inference_idle_env_s: float
    num_servers: int
    sandbox_held_util: float
    sandbox_exec_util: float
    outcomes: dict[str, int]
    prefix_cache_hit_rate: float | None
    lower_bound: dict[str, Any]
    efficiency: float | None
    accepted_profile: Profile
    pool_profile: Profile
    extra: dict[str, Any] = field(default_factory=dict)
    staleness: dict[str, Any] | None = None  # staleness report of the batch (None: unmeasured)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def staleness_scalars(report: Mapping[str, Any] | None) -> dict[str, float]:
    """The numeric scalars of a staleness report as ``rollbank_staleness_*`` names ({} if None)."""
    return prometheus_samples(report) if report is not None else {}


def _spans_in(trajs: Iterable[Trajectory]) -> list[Span]:
    return [s for t in trajs for s in spans_of(t)]


def summarize_batch(
    batch_index: int,
    accepted: Sequence[Trajectory],
    *,
    t_start: float,
    t_end: float,
    seen: Sequence[Trajectory],
    capacity: Capacity | None,
    servers: Sequence[str],
    groups_needed: int | None = None,
    group_size: int | None = None,
    sandbox_slots: int | None = None,
    extra: dict[str, Any] | None = None,
    staleness: Mapping[str, Any] | None = None,
    consumed_groups: Collection[str] = (),
) -> BatchSummary:
    """Summarise one batch. ``seen`` is every trajectory that finished by ``t_end`` (the pool);
    with ``group_size`` only groups with that many finished siblings count for the path term.
    Without a ``capacity`` (servers not calibrated) there is no lower bound and no
    utilisation of sandbox slots. ``consumed_groups``: groups handed over in earlier batches,
    not candidates for this one (the path term's pool leaves them out)."""
    T = max(t_end - t_start, 0.0)
    finishes = [max(t.finished_at - t_start, 0.0) for t in accepted]
    # No accepted trajectory (an empty window): T90 = T100 = 0, tail share 0.
    t90, t100 = quantile(finishes, 0.9) or 0.0, max(finishes, default=0.0)
    spans = _spans_in(seen)
    inf = [s for s in spans if s.kind == "inference"]
    window_inf = [s for s in inf if t_start <= s.end <= t_end]
    env = clip([(s.start, s.end) for s in spans
                if s.kind in ("sandbox_setup", "exec", "verify")], t_start, t_end)
    busy = idle_env = 0.0
    for server in servers:
        mine = clip([(s.start, s.end) for s in inf if s.server == server], t_start, t_end)
        busy += measure(mine)
        idle_env += measure(subtract(union(env), union(mine)))
    held = clip([(s.start, s.end) for s in spans if s.kind == "episode"], t_start, t_end)
    held_s = sum(b - a for a, b in held)
    exec_s = sum(b - a for a, b in clip([(s.start, s.end) for s in spans if s.kind == "exec"],
                                        t_start, t_end))
    slots = sandbox_slots or (capacity.sandbox_slots if capacity is not None else None)
    slot_s = (slots or 0) * T
    tokens = sum(s.gen_tokens for s in window_inf)
    reported = [s for s in window_inf if s.cached_tokens is not None]
    sent = sum(s.prompt_tokens for s in reported)
    # Pool for the path term: every complete group that finished in the window.
    pool_groups: dict[str, list[Trajectory]] = {}
    for t in seen:
        if t.group_id not in consumed_groups:
            pool_groups.setdefault(t.group_id, []).append(t)
    complete = [g for g in pool_groups.values() if group_size is None or len(g) >= group_size]
    prefilled = sum(s.uncached_tokens for s in window_inf)
    lb = None if capacity is None else lower_bound(
        accepted, capacity, pool=[t for g in complete for t in g], groups_needed=groups_needed,
        window_start=t_start, observed_decode_rate=tokens / T if T > 0 else 0.0,
        observed_prefill_rate=prefilled / T if T > 0 else 0.0)
    pool = [t for t in seen if t_start <= t.finished_at <= t_end]
    return BatchSummary(
        batch_index=batch_index,
        t_start=t_start,
        t_end=t_end,
        n_trajectories=len(accepted),
        n_groups=len({t.group_id for t in accepted}),
        time_to_batch_s=T,
        t90_s=t90,
        t100_s=t100,
        tail_share=(t100 - t90) / t100 if t100 > 0 else 0.0,
        model_tokens=tokens,
        tokens_per_s=tokens / T if T > 0 else 0.0,
        inference_busy_s=busy,
        inference_idle_env_s=idle_env,
        num_servers=len(servers),
        sandbox_held_util=held_s / slot_s if slot_s > 0 else 0.0,
        sandbox_exec_util=exec_s / slot_s if slot_s > 0 else 0.0,
        outcomes=dict(Counter(t.outcome.outcome.value for t in accepted if t.outcome)),
        prefix_cache_hit_rate=(sum(s.cached_tokens or 0 for s in reported) / sent) if sent else None,
        lower_bound=lb.to_dict() if lb is not None else {},
        efficiency=lb.efficiency(T) if lb is not None else None,
        accepted_profile=Profile.of(accepted),
        pool_profile=Profile.of(pool),
        extra=dict(extra or {}),
        staleness=dict(staleness) if staleness is not None else None,
    )
