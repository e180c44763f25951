"""Building the collection driver, with the staleness gate or without.

:func:`collection_driver` reads a :class:`~rollbank.staleness.config.StalenessConfig`
(``collection.enabled``): off, the plain :class:`~rollbank.scheduling.drivers.driver.CollectionDriver`;
on, the same driver running a :class:`~rollbank.scheduling.policy.scheduler.Scheduler` whose
gate is :class:`~rollbank.scheduling.policy.gating.StalenessGating`, with a scorer (given, or
the engine's :class:`~rollbank.scheduling.drivers.scoring.EngineScorer` over the clients that
can score) for its :class:`~rollbank.scheduling.drivers.group_scoring.GroupScoring`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rollbank.clock import Clock, MonotonicClock
from rollbank.errors import ConfigError
from rollbank.inference.protocol import ServerFeed
from rollbank.sandbox.protocol import CapacityFeed
from rollbank.scheduling.config import SchedulerConfig
from rollbank.scheduling.drivers.driver import AttemptRunner, CollectionDriver
from rollbank.scheduling.drivers.scoring import EngineScorer, PolicyScorer, ScoringClient
from rollbank.scheduling.policy.events import EventSink
from rollbank.scheduling.policy.gating import StalenessGating
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.staleness.config import StalenessConfig


def collection_driver(config: SchedulerConfig, runner: AttemptRunner, task_ids: list[str], *,
                      staleness: StalenessConfig | None = None,
                      scorer: PolicyScorer | None = None, clients: Sequence[object] = (),
                      sink: EventSink | None = None,
                      clock: Clock | None = None,
                      capacity: CapacityFeed | None = None,
                      servers: ServerFeed | None = None,
                      on_servers: Callable[[tuple[str, ...]], None] | None = None,
                      ) -> CollectionDriver:
    """The driver under the staleness gate when ``staleness.collection.enabled``, else the
    plain one.

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
    clock = clock or MonotonicClock()
    scheduler = Scheduler(config, task_ids, clock, gate=StalenessGating(staleness))
    return CollectionDriver(config, runner, task_ids, sink=sink, clock=clock, scheduler=scheduler,
                            scorer=scorer, capacity=capacity, servers=servers,
                            on_servers=on_servers)
