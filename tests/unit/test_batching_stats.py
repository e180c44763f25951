"""Per-batch version-lag histogram."""

from __future__ import annotations

from rollbank.batching.stats import max_version, mixed_version_fraction, version_lag_histogram
from rollbank.episodes.trajectory import Trajectory


def _traj(versions: list[int]) -> Trajectory:
    t = Trajectory("t", "g", "task", 0)
    t.append_prompt([1, 2])
    for v in versions:
        t.append_model([5, 6], [-1.0, -1.0], v)
        t.append_prompt([9])
    return t


def test_version_lag_counts_model_tokens_only_per_version() -> None:
    partial = _traj([3, 4, 5])  # a carried rollout sampled by three versions
    fresh = _traj([5])
    assert max_version([partial, fresh]) == 5
    assert version_lag_histogram([partial, fresh], 5) == {0: 4, 1: 2, 2: 2}
    assert mixed_version_fraction([partial, fresh]) == 0.5
