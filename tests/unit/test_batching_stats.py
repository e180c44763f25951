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


def test_lag_histogram_skips_environment_tokens_and_refuses_misaligned_records() -> None:
    import pytest

    t = _traj([3, 4])  # prompt tokens carry ENV_VERSION with mask 0; model tokens mask 1
    assert version_lag_histogram([t], 4) == {0: 2, 1: 2}
    assert version_lag_histogram([], 4) == {}
    t.loss_mask.append(1)  # one entry more than the versions: a corrupt record
    with pytest.raises(ValueError, match=r"trajectory t: 8 policy versions for 9 loss-mask"):
        version_lag_histogram([t], 4)
