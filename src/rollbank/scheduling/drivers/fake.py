"""In-memory fake :class:`~rollbank.scheduling.drivers.driver.AttemptRunner` for tests and simulation.

A :class:`FakeAttemptRunner` plays a scripted episode per attempt: ``turns`` generate calls
(each inside the driver's inference slot, each appending model and observation tokens and,
when a :class:`~rollbank.clock.FakeClock` is given, advancing it by ``turn_s``), an optional
gate to hold the attempt until a test releases it, then the scripted outcome. It records
which attempts started, finished and were cancelled, so tests can check that aborts really
reach the runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from rollbank.clock import Clock, FakeClock
from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.scheduling.policy.types import AttemptSpec


@dataclass(frozen=True)
class FakePlan:
    """Script of one fake attempt."""

    reason: Reason = Reason.VERIFIED_PASS
    reward: float | None = 1.0
    turns: int = 2
    tokens_per_turn: int = 3
    turn_s: float = 1.0
    version: int = 0
    server: str = ""
    gate: asyncio.Event | None = None  # wait for it before finishing
    raises: Exception | None = None  # a runner bug (the driver must record host_error)


def make_trajectory(spec: AttemptSpec, plan: FakePlan, *, now: float) -> Trajectory:
    """A consistent trajectory for ``spec`` following ``plan`` (prompt of 4 tokens)."""
    traj = Trajectory(
        trajectory_id=spec.attempt_id, group_id=spec.group_id, task_id=spec.task_id,
        attempt=spec.slot, retry=spec.retry, seed=spec.seed, launched_at=spec.launched_at,
        started_at=spec.launched_at, finished_at=now, task_hash=f"hash-{spec.task_id}",
    )
    traj.append_prompt([1, 2, 3, 4])
    traj.prompt_len = 4
    for turn in range(plan.turns):
        ids = [100 + turn] * plan.tokens_per_turn
        traj.append_model(ids, [-0.5] * len(ids), plan.version)
        traj.append_prompt([7, 8])  # observation tokens
    if plan.server:
        traj.servers.append(plan.server)
    traj.outcome = EpisodeOutcome.of(plan.reason, reward=plan.reward)
    return traj


@dataclass
class FakeAttemptRunner:
    """Runs :class:`FakePlan` scripts; ``plan_for`` picks the plan of each attempt."""

    plan_for: Callable[[AttemptSpec], FakePlan] = field(default=lambda _spec: FakePlan())
    clock: Clock | None = None
    started: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    max_concurrent_inference: int = 0
    _in_inference: int = 0

    async def run(self, attempt: AttemptSpec) -> Trajectory:
        plan = self.plan_for(attempt)
        self.started.append(attempt.attempt_id)
        attempt.ctx.mark_started()
        try:
            for _ in range(plan.turns):
                async with attempt.ctx.inference_slot(plan.server):
                    self._in_inference += 1
                    self.max_concurrent_inference = max(
                        self.max_concurrent_inference, self._in_inference
                    )
                    try:
                        await asyncio.sleep(0)
                    finally:
                        self._in_inference -= 1
                if isinstance(self.clock, FakeClock):
                    self.clock.advance(plan.turn_s)
            if plan.gate is not None:
                await plan.gate.wait()
            if plan.raises is not None:
                raise plan.raises
        except asyncio.CancelledError:
            self.cancelled.append(attempt.attempt_id)
            raise
        now = self.clock.now() if self.clock is not None else 0.0
        self.finished.append(attempt.attempt_id)
        return make_trajectory(attempt, plan, now=now)
