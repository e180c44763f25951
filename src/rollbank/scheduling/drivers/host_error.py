"""The record of an attempt whose runner raised (a runner bug): ``infra_failure/host_error``,
so the failure is data in the ledger and the batch accounting, not a crashed collection."""

from __future__ import annotations

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.scheduling.policy.types import AttemptSpec


def host_error_trajectory(spec: AttemptSpec, exc: Exception, now: float) -> Trajectory:
    return Trajectory(
        trajectory_id=spec.attempt_id,
        group_id=spec.group_id,
        task_id=spec.task_id,
        attempt=spec.slot,
        retry=spec.retry,
        seed=spec.seed,
        launched_at=spec.launched_at,
        finished_at=now,
        outcome=EpisodeOutcome.of(
            Reason.HOST_ERROR, error=f"{type(exc).__name__}: {exc}", where="runner"
        ),
    )
