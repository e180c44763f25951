"""Scoring a complete group against the current policy: the :class:`PolicyScorer` seam.

Before the staleness gate (:mod:`rollbank.scheduling.gated_bank`) releases a group, the
driver (:mod:`rollbank.scheduling.gated_driver`) asks a scorer for the current policy's
log-prob of every token of each valid sibling. Two scorers implement the seam:

- :class:`EngineScorer` (here): the serving engine scores each sequence with prompt
  log-probs (``POST /v1/completions`` with ``prompt_logprobs=0``, prefill only,
  :meth:`VLLMClient.prompt_logprobs`). The engine's version is read before and after; a
  publication in between makes the result ambiguous, so the sequence is scored again (up to
  ``version_retries`` times) and otherwise left unmeasured. It waits on the client's
  admission gate like a generation, so no scoring request reaches an engine mid-publication.
- ``rollbank.training.scorer.TrainerScorer``: the trainer's recompute (blocking forward pass,
  run in a worker thread).

A scorer never raises for one sequence: a failed sequence is ``None`` (unmeasured) with its
error in :attr:`GroupScores.errors`; the gate then applies ``admit_unmeasured``.
:class:`FakeScorer` (unit tests) returns scripted log-probs.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from rollbank.episodes.trajectory import Trajectory
from rollbank.errors import InferenceError
from rollbank.inference.protocol import AdmissionGate

ENGINE_SCORER = "engine_prompt_logprobs"


@dataclass(frozen=True)
class GroupScores:
    """The current policy's log-probs of a group's trajectories.

    ``logprobs[trajectory_id]`` has one value per token of the trajectory (``out[0] = 0``;
    only model tokens are read); ``None`` = unmeasured. ``version`` is the weight version
    that scored them (the engine's, or the trainer's)."""

    version: int
    logprobs: Mapping[str, Sequence[float] | None]
    scorer: str
    seconds: float = 0.0  # wall time of the scoring call
    tokens: int = 0  # tokens scored (prompt + model, every sequence)
    errors: Mapping[str, str] = field(default_factory=dict)  # trajectory id -> why unmeasured


class PolicyScorer(Protocol):
    """Scores trajectories with the current policy (engine prompt log-probs or trainer
    recompute). Must not block the event loop; must not raise for one bad sequence."""

    @property
    def name(self) -> str: ...

    async def score(self, trajectories: Sequence[Trajectory]) -> GroupScores: ...


class ScoringClient(Protocol):
    """What :class:`EngineScorer` needs from an engine client (a ``VLLMClient`` has it)."""

    @property
    def admission(self) -> AdmissionGate: ...

    async def prompt_logprobs(self, token_ids: list[int], *, request_id: str) -> list[float]: ...

    async def engine_version(self, request_id: str | None = None) -> int: ...


class EngineScorer:
    """Scores each sequence on one of ``clients`` (round robin) with prompt log-probs.

    All sequences of one call are scored concurrently; the group's ``version`` is the version
    every measured sequence was scored at (sequences scored at another version than the
    first one are scored again, so one call reports one version)."""

    name = ENGINE_SCORER

    def __init__(self, clients: Sequence[ScoringClient], *, version_retries: int = 2,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not clients:
            raise ValueError("EngineScorer needs at least one client")
        self.clients = list(clients)
        self.version_retries = version_retries
        self._next = itertools.count()
        self._clock = clock

    async def _one(self, traj: Trajectory) -> tuple[int, list[float]]:
        """``(version, logprobs)`` of one sequence, its version unchanged across the call."""
        client = self.clients[next(self._next) % len(self.clients)]
        rid = f"score-{traj.trajectory_id}"
        for _ in range(self.version_retries + 1):
            await client.admission.wait_open()
            before = await client.engine_version(rid)
            values = await client.prompt_logprobs(list(traj.token_ids), request_id=rid)
            if await client.engine_version(rid) == before:
                return before, values
        raise InferenceError(f"{rid}: the engine's version changed during every scoring try",
                             request_id=rid)

    async def score(self, trajectories: Sequence[Trajectory]) -> GroupScores:
        t0 = self._clock()
        results = await asyncio.gather(*(self._one(t) for t in trajectories),
                                       return_exceptions=True)
        errors: dict[str, str] = {}
        versions = [r[0] for r in results if isinstance(r, tuple)]
        version = max(versions, default=-1)
        out: dict[str, Sequence[float] | None] = {}
        for traj, res in zip(trajectories, results, strict=True):
            if isinstance(res, tuple) and res[0] != version:  # a publication between them
                try:
                    res = await self._one(traj)
                except InferenceError as exc:
                    res = exc
                if isinstance(res, tuple) and res[0] != version:
                    res = InferenceError(f"scored at version {res[0]}, the group at {version}")
            if isinstance(res, BaseException):
                if not isinstance(res, Exception):
                    raise res  # cancellation and the like are not a scoring failure
                out[traj.trajectory_id] = None
                errors[traj.trajectory_id] = f"{type(res).__name__}: {res}"
            else:
                out[traj.trajectory_id] = res[1]
        return GroupScores(version, out, self.name, self._clock() - t0,
                           sum(len(t.token_ids) for t in trajectories), errors)


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
