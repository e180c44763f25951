"""GRPO advantages: valid siblings only, zero-variance groups, reward defaults."""

from __future__ import annotations

import math

import pytest

from rollbank.batching.advantages import group_advantages, grpo_advantages, reward_of
from rollbank.batching.config import AdvantageConfig
from rollbank.episodes.outcome import Reason
from rollbank.scheduling.drivers.fake import FakePlan, make_trajectory
from rollbank.scheduling.policy.types import AttemptKey, AttemptSpec


def _traj(slot: int, reason: Reason, reward: float | None):  # type: ignore[no-untyped-def]
    spec = AttemptSpec(AttemptKey(0, slot, 0, "g"), "t", 0, 4, 0.0)
    return make_trajectory(spec, FakePlan(reason, reward), now=1.0)


def test_grpo_advantages_are_standardised_over_the_group() -> None:
    adv = grpo_advantages([1.0, 0.0, 0.0, 1.0], AdvantageConfig())
    assert adv.mean == 0.5 and adv.std == 0.5
    assert adv.advantages == pytest.approx((1.0, -1.0, -1.0, 1.0), rel=1e-5)
    assert not adv.zero_variance


def test_without_std_normalisation_advantages_are_centred_rewards() -> None:
    adv = grpo_advantages([1.0, 0.0, 0.5], AdvantageConfig(normalize_std=False))
    assert adv.advantages == pytest.approx((0.5, -0.5, 0.0))


def test_zero_variance_group_is_flagged_with_zero_advantages() -> None:
    adv = grpo_advantages([0.3, 0.3, 0.3], AdvantageConfig())
    assert adv.zero_variance and adv.advantages == (0.0, 0.0, 0.0)


def test_infra_failures_leave_both_gradient_and_baseline() -> None:
    trajs = [
        _traj(0, Reason.VERIFIED_PASS, 1.0),
        _traj(1, Reason.SANDBOX_DIED, None),
        _traj(2, Reason.VERIFIED_FAIL, 0.0),
        _traj(3, Reason.UNATTRIBUTED, None),
    ]
    valid, adv = group_advantages(trajs, AdvantageConfig())
    assert [t.attempt for t in valid] == [0, 2]
    assert adv.mean == 0.5  # the infra attempts did not pull the baseline to 0.25
    assert adv.advantages == pytest.approx((1.0, -1.0), rel=1e-5)
    assert math.fsum(adv.advantages) == pytest.approx(0.0)


def test_model_failure_without_a_verifier_reward_gets_the_failure_reward() -> None:
    cfg = AdvantageConfig(failure_reward=-0.5)
    assert reward_of(_traj(0, Reason.STEP_TIMEOUT, None), cfg) == -0.5
    with pytest.raises(ValueError):
        reward_of(_traj(0, Reason.HOST_ERROR, None), cfg)
