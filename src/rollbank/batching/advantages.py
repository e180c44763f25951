"""GRPO advantages over a group's valid siblings.

Only trajectories whose outcome is trainable (``model_success`` / ``model_failure``) enter
the group baseline and receive an advantage; ``infra_failure`` and ``unknown`` attempts are
excluded from both. ``A_i = (r_i - mean(r)) / (std(r) + eps)`` with the population std over
the valid siblings (or ``r_i - mean(r)`` when ``normalize_std`` is off). A group whose valid
rewards are all equal has zero variance: every advantage is exactly 0.0 and it is flagged.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rollbank.batching.config import AdvantageConfig
from rollbank.episodes.outcome import Outcome
from rollbank.episodes.trajectory import Trajectory


@dataclass(frozen=True)
class GroupAdvantages:
    rewards: tuple[float, ...]
    advantages: tuple[float, ...]
    mean: float
    std: float
    zero_variance: bool


def is_valid(traj: Trajectory) -> bool:
    """Whether ``traj`` may enter the gradient and its group's baseline."""
    return traj.outcome is not None and traj.outcome.outcome.trainable


def reward_of(traj: Trajectory, config: AdvantageConfig) -> float:
    """The scalar reward of a valid trajectory (verifier's, else the configured default)."""
    if traj.outcome is None or not traj.outcome.outcome.trainable:
        raise ValueError(f"{traj.trajectory_id} is not trainable; it has no reward to train on")
    if traj.outcome.reward is not None:
        return float(traj.outcome.reward)
    if traj.outcome.outcome is Outcome.MODEL_SUCCESS:
        return config.success_reward
    return config.failure_reward


def grpo_advantages(rewards: Sequence[float], config: AdvantageConfig) -> GroupAdvantages:
    """Advantages for the rewards of a group's valid siblings (at least one)."""
    if not rewards:
        raise ValueError("a group needs at least one valid sibling for advantages")
    n = len(rewards)
    mean = math.fsum(rewards) / n
    var = math.fsum((r - mean) ** 2 for r in rewards) / n
    std = math.sqrt(var)
    zero = all(r == rewards[0] for r in rewards)
    if zero:
        adv = tuple(0.0 for _ in rewards)
    elif config.normalize_std:
        adv = tuple((r - mean) / (std + config.eps) for r in rewards)
    else:
        adv = tuple(r - mean for r in rewards)
    return GroupAdvantages(tuple(float(r) for r in rewards), adv, mean, std, zero)


def group_advantages(
    trajectories: Sequence[Trajectory], config: AdvantageConfig
) -> tuple[list[Trajectory], GroupAdvantages]:
    """Keep the valid siblings (slot order preserved) and compute their advantages."""
    valid = [t for t in trajectories if is_valid(t)]
    return valid, grpo_advantages([reward_of(t, config) for t in valid], config)
