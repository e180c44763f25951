"""Cheap per-batch off-policy statistics from what the trajectories recorded.

The version-lag histogram counts model tokens (``loss_mask == 1``) by
``current_version - policy_version``; a carried (partial) rollout whose tokens were sampled by
several weight versions contributes to several bins. Environment tokens are not counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import compress

from rollbank.episodes.trajectory import ENV_VERSION, Trajectory


def version_lag_histogram(trajectories: Iterable[Trajectory], current_version: int) -> dict[int, int]:
    """``{lag: model token count}`` sorted by lag; lags are >= 0 when versions are consistent."""
    by_version: Counter[int] = Counter()
    for t in trajectories:
        if len(t.policy_versions) != len(t.loss_mask):
            raise ValueError(f"trajectory {t.trajectory_id}: {len(t.policy_versions)} policy "
                             f"versions for {len(t.loss_mask)} loss-mask entries")
        by_version.update(compress(t.policy_versions, t.loss_mask))  # counted in C
    by_version.pop(ENV_VERSION, None)
    return dict(sorted((current_version - v, n) for v, n in by_version.items() if n))


def max_version(trajectories: Iterable[Trajectory]) -> int:
    """Newest policy version seen in any token (``ENV_VERSION`` if none)."""
    return max((t.max_version for t in trajectories), default=ENV_VERSION)


def mixed_version_fraction(trajectories: Iterable[Trajectory]) -> float:
    """Fraction of trajectories whose model tokens span more than one version (partials)."""
    ts = list(trajectories)
    if not ts:
        return 0.0
    return sum(1 for t in ts if t.min_version != t.max_version) / len(ts)
