"""Scoring a complete group against the current policy: the :class:`PolicyScorer` seam.

Before the staleness gate (:mod:`rollbank.scheduling.policy.gating`) releases a group, the
driver (:mod:`rollbank.scheduling.drivers.group_scoring`) asks a scorer for the current policy's
log-prob of every token of each valid sibling. Two scorers implement the seam:

- :class:`EngineScorer` (here): the serving engine scores each sequence with prompt
  log-probs (``POST /v1/completions`` with ``prompt_logprobs=0``, prefill only,
  :meth:`VLLMClient.prompt_logprobs`). The engines' version is read before and after the
  group; a publication in between makes the result ambiguous, so the group is scored again
  (up to ``version_retries`` times) and otherwise left unmeasured. It waits on the client's
  admission gate like a generation, so no scoring request reaches an engine mid-publication.
- ``rollbank.training.scorer.TrainerScorer``: the trainer's recompute (blocking forward pass,
  run in a worker thread).

A scorer never raises for one sequence: a failed sequence is ``None`` (unmeasured) with its
error in :attr:`~rollbank.scheduling.policy.scores.GroupScores.errors`; the gate then applies ``admit_unmeasured``.
:class:`FakeScorer` (unit tests) returns scripted log-probs.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from rollbank.episodes.trajectory import Trajectory
from rollbank.inference.protocol import AdmissionGate
from rollbank.scheduling.policy.scores import GroupScores

ENGINE_SCORER = "engine_prompt_logprobs"


class PolicyScorer(Protocol):
    """Scores trajectories with the current policy (engine prompt log-probs or trainer
    recompute). Must not block the event loop; must not raise for one bad sequence."""

    @property
    def name(self) -> str: ...

    async def score(self, trajectories: Sequence[Trajectory]) -> GroupScores: ...


@runtime_checkable
class ScoringClient(Protocol):
    """What :class:`EngineScorer` needs from an engine client (a ``VLLMClient`` has it)."""

    @property
    def admission(self) -> AdmissionGate: ...

    async def prompt_logprobs(self, token_ids: list[int], *, request_id: str) -> list[float]: ...

    async def engine_version(self, request_id: str | None = None) -> int: ...


class EngineScorer:
    """Scores a group's sequences on ``clients`` (round robin) with prompt log-probs.

    One call scores all sequences concurrently between two version reads of every client it
    uses (``GET /weight_info`` before and after): the group is reported at one version. If a
    version moved during the call, or the clients disagree (a fleet publication in
    progress), the group is scored again, at most ``version_retries`` times; then every
    sequence is unmeasured. A sequence whose request fails is unmeasured on its own."""

    name = ENGINE_SCORER

    def __init__(self, clients: Sequence[ScoringClient], *, version_retries: int = 2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not clients:
            raise ValueError("EngineScorer needs at least one client")
        self.clients = list(clients)
        self.version_retries = version_retries
        self._next = itertools.count()
        self._clock = clock

    async def _versions(self, used: Sequence[ScoringClient], rid: str) -> list[int]:
        return list(await asyncio.gather(*(c.engine_version(rid) for c in used)))

    async def score(self, trajectories: Sequence[Trajectory]) -> GroupScores:
        t0 = self._clock()
        tokens = sum(len(t.token_ids) for t in trajectories)
        start = next(self._next)
        assigned = [self.clients[(start + i) % len(self.clients)] for i in range(len(trajectories))]
        used = list({id(c): c for c in assigned}.values())
        rid = f"score-{trajectories[0].group_id}" if trajectories else "score"
        for _ in range(self.version_retries + 1):
            for c in used:
                await c.admission.wait_open()
            before = await self._versions(used, rid)
            results = await asyncio.gather(*(
                c.prompt_logprobs(list(t.token_ids), request_id=f"score-{t.trajectory_id}")
                for c, t in zip(assigned, trajectories, strict=True)), return_exceptions=True)
            after = await self._versions(used, rid)
            if before == after and len(set(before)) <= 1:
                break
        else:
            why = "the engines' version changed during every scoring try"
            return GroupScores(-1, {t.trajectory_id: None for t in trajectories}, self.name,
                               self._clock() - t0, tokens, {t.trajectory_id: why for t in trajectories})
        out: dict[str, Sequence[float] | None] = {}
        errors: dict[str, str] = {}
        for traj, res in zip(trajectories, results, strict=True):
            if isinstance(res, BaseException):
                if not isinstance(res, Exception):
                    raise res  # cancellation and the like are not a scoring failure
                out[traj.trajectory_id] = None
                errors[traj.trajectory_id] = f"{type(res).__name__}: {res}"
            else:
                out[traj.trajectory_id] = res
        version = before[0] if before else -1
        return GroupScores(version, out, self.name, self._clock() - t0, tokens, errors)


@dataclass
class FakeScorer:
    """Unit tests: ``logprobs_for(traj)`` gives the current log-probs (None: unmeasured),
    ``version`` the scoring version; ``gate`` holds every call until set; ``calls`` records
    the trajectory ids of each call."""

    logprobs_for: Callable[[Trajectory], Sequence[float] | None] = field(
        default=lambda t: list(t.logprobs))
    version: int = 0
    gate: asyncio.Event | None = None
    raises: Exception | None = None
    calls: list[tuple[str, ...]] = field(default_factory=list)
    name: str = "fake"

    async def score(self, trajectories: Sequence[Trajectory]) -> GroupScores:
        self.calls.append(tuple(t.trajectory_id for t in trajectories))
        if self.gate is not None:
            await self.gate.wait()
        if self.raises is not None:
            raise self.raises
        return GroupScores(self.version, {t.trajectory_id: self.logprobs_for(t)
                                          for t in trajectories}, self.name)
