"""The collection driver with the staleness gate: it scores complete groups before release.

:class:`GatedCollectionDriver` is the :class:`~rollbank.scheduling.driver.CollectionDriver`
running a :class:`~rollbank.scheduling.gated.GatedScheduler`. After each result reaches the
scheduler, every group that became complete is scored by the :class:`PolicyScorer` in its
own task inside the collector's ``TaskGroup`` (engine scoring is async HTTP; the trainer
scorer runs its forward pass in a worker thread: nothing blocks the loop). The scores go back
to the pure scheduler (:meth:`GatedScheduler.on_scored`) on the loop, and the loop is woken to
launch re-runs or emit batches.

Invariants
- A scorer failure (an exception out of ``score``) scores the group as unmeasured (every
  member ``None``, the error in ``GroupScores.errors``): the gate's ``admit_unmeasured``
  decides; collection goes on.
- Scoring tasks count as work in flight (no "collection stalled" while a group is scored);
  they are cancelled with the attempts when the iteration ends.
- Only what the scorer spends on scoring is added to the engines' load: scoring requests do
  not take the scheduler's inference slots (they are prefill-only and short).

:func:`collection_driver` builds the plain or the gated driver from a
:class:`~rollbank.staleness.config.StalenessConfig` (``collection.enabled``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from rollbank.clock import Clock, MonotonicClock
from rollbank.errors import ConfigError
from rollbank.inference.protocol import ServerFeed
from rollbank.sandbox.protocol import CapacityFeed
from rollbank.scheduling.config import SchedulerConfig
from rollbank.scheduling.driver import AttemptRunner, CollectionDriver
from rollbank.scheduling.events import EventSink
from rollbank.scheduling.gated import GatedScheduler
from rollbank.scheduling.gated_bank import NeedsScoring
from rollbank.scheduling.scoring import EngineScorer, GroupScores, PolicyScorer, ScoringClient
from rollbank.staleness.config import StalenessConfig


class GatedCollectionDriver(CollectionDriver):
    """Collect under the staleness gate; ``scorer`` gives the current policy's log-probs.

    ``scoring_log`` keeps, per scoring call, ``(group_id, scorer, version, seconds, tokens,
    unmeasured)`` for reports and benchmarks."""

    scheduler: GatedScheduler

    def __init__(self, config: SchedulerConfig, runner: AttemptRunner, task_ids: list[str], *,
                 scorer: PolicyScorer, staleness: StalenessConfig,
                 sink: EventSink | None = None, clock: Clock | None = None,
                 capacity: CapacityFeed | None = None, servers: ServerFeed | None = None,
                 on_servers: Callable[[tuple[str, ...]], None] | None = None) -> None:
        clock = clock or MonotonicClock()
        scheduler = GatedScheduler(config, task_ids, clock, staleness=staleness)
        super().__init__(config, runner, task_ids, sink=sink, clock=clock, scheduler=scheduler,
                         capacity=capacity, servers=servers, on_servers=on_servers)
        self.scorer = scorer
        self._scoring: dict[str, asyncio.Task[None]] = {}
        self.scoring_log: list[tuple[str, str, int, float, int, int]] = []

    def _busy(self) -> bool:
        return bool(self._tasks) or bool(self._scoring)

    def _after_finished(self, tg: asyncio.TaskGroup) -> None:
        for need in self.scheduler.drain_scoring():
            self._scoring[need.group_id] = tg.create_task(
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
            self._scoring.pop(need.group_id, None)
        self.scoring_log.append((need.group_id, scores.scorer, scores.version, scores.seconds,
                                 scores.tokens, sum(v is None for v in scores.logprobs.values())))
        if self.scheduler.done:
            return
        self.scheduler.on_scored(need.group_id, scores)
        self._flush_events()
        self._nudge()  # re-runs to launch, or a batch due

    def _abort_all(self) -> None:
        for task in list(self._scoring.values()):
            task.cancel()
        self._scoring.clear()
        super()._abort_all()


def collection_driver(config: SchedulerConfig, runner: AttemptRunner, task_ids: list[str], *,
                      staleness: StalenessConfig | None = None,
                      scorer: PolicyScorer | None = None, clients: Sequence[object] = (),
                      sink: EventSink | None = None,
                      clock: Clock | None = None,
                      capacity: CapacityFeed | None = None,
                      servers: ServerFeed | None = None,
                      on_servers: Callable[[tuple[str, ...]], None] | None = None,
                      ) -> CollectionDriver:
    """The gated driver when ``staleness.collection.enabled``, else the plain one.

    The scorer is ``scorer`` if given, else (``collection.scorer = "engine"``) an
    :class:`EngineScorer` over those of ``clients`` that can score (vLLM clients). The
    trainer scorer needs the trainer: its caller passes a ``TrainerScorer``. ``servers`` /
    ``on_servers``: managed servers still starting, see :class:`CollectionDriver`."""
    if staleness is None or not staleness.collection.enabled:
        return CollectionDriver(config, runner, task_ids, sink=sink, clock=clock,
                                capacity=capacity, servers=servers, on_servers=on_servers)
    if scorer is None:
        field = "staleness.collection.scorer"
        if staleness.collection.scorer != "engine":
            raise ConfigError("the trainer scorer needs a trainer: the caller (rollbank train) "
                              "must pass a TrainerScorer", field=field)
        able = [c for c in clients if isinstance(c, ScoringClient)]
        if not able:
            raise ConfigError("the engine scorer needs servers that score prompt log-probs "
                              "(vLLM); none of the inference clients can", field=field)
        scorer = EngineScorer(able, version_retries=staleness.collection.version_retries)
    return GatedCollectionDriver(config, runner, task_ids, scorer=scorer, staleness=staleness,
                                 sink=sink, clock=clock, capacity=capacity, servers=servers,
                                 on_servers=on_servers)
