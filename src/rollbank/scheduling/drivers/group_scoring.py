"""Scoring complete groups for the scheduler's gate: the driver's scoring tasks.

:class:`GroupScoring` is a component the :class:`~rollbank.scheduling.drivers.driver.CollectionDriver`
owns when its scheduler runs a gate (``Scheduler(..., gate=...)``). After each result reaches
the scheduler, every group the gate holds (``scheduler.drain_scoring()``) is scored by the
:class:`~rollbank.scheduling.drivers.scoring.PolicyScorer` in its own task inside the
collector's ``TaskGroup`` (engine scoring is async HTTP; the trainer scorer runs its forward
pass in a worker thread: nothing blocks the loop). The scores go back to the driver's
``on_scores`` (which hands them to the pure scheduler on the loop and wakes it to launch
re-runs or emit batches).

Invariants
- A scorer failure (an exception out of ``score``) scores the group as unmeasured (every
  member ``None``, the error in ``GroupScores.errors``): the gate's ``admit_unmeasured``
  decides; collection goes on.
- Scoring tasks count as work in flight (:attr:`GroupScoring.busy`: no "collection stalled"
  while a group is scored); :meth:`GroupScoring.cancel_all` cancels them with the attempts
  when the iteration ends.
- Only what the scorer spends on scoring is added to the engines' load: scoring requests do
  not take the scheduler's inference slots (they are prefill-only and short).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from rollbank.scheduling.drivers.scoring import PolicyScorer
from rollbank.scheduling.policy.group_gate import NeedsScoring
from rollbank.scheduling.policy.scores import GroupScores


class GroupScoring:
    """Score held groups with ``scorer``; report each result to ``on_scores``.

    ``log`` keeps, per scoring call, ``(group_id, scorer, version, seconds, tokens,
    unmeasured)`` for reports and benchmarks."""

    def __init__(self, scorer: PolicyScorer,
                 on_scores: Callable[[str, GroupScores], None]) -> None:
        self.scorer = scorer
        self._on_scores = on_scores
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.log: list[tuple[str, str, int, float, int, int]] = []

    @property
    def busy(self) -> bool:
        return bool(self._tasks)

    def start(self, needs: Iterable[NeedsScoring], tg: asyncio.TaskGroup) -> None:
        for need in needs:
            self._tasks[need.group_id] = tg.create_task(
                self._score(need), name=f"rollbank-score-{need.group_id}")

    async def _score(self, need: NeedsScoring) -> None:
        try:
            scores = await self.scorer.score(need.trajectories)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a scoring failure is data: the group is unmeasured
            why = f"{type(exc).__name__}: {exc}"
            scores = GroupScores(-1, {t.trajectory_id: None for t in need.trajectories},
                                 self.scorer.name,
                                 errors={t.trajectory_id: why for t in need.trajectories})
        finally:
            self._tasks.pop(need.group_id, None)
        self.log.append((need.group_id, scores.scorer, scores.version, scores.seconds,
                         scores.tokens, sum(v is None for v in scores.logprobs.values())))
        self._on_scores(need.group_id, scores)

    def cancel_all(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        self._tasks.clear()
