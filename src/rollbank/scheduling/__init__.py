"""Group-aware collection: pure scheduler and ready bank, and the asyncio driver around them.

Public API (what the episode layer, metrics and CLI code against)::

    from rollbank.scheduling import (
        CollectionDriver, AttemptRunner, AttemptSpec, AttemptContext, SchedulerConfig,
        Batch, GroupResult, EventSink, Event, EventKind,
    )

    class EpisodeRunner:                      # implements AttemptRunner
        async def run(self, attempt: AttemptSpec) -> Trajectory:
            ...                               # start sandbox for attempt.task_id
            attempt.ctx.mark_started()        # sandbox ready -> "started" event
            async with attempt.ctx.inference_slot(server_url):
                result = await client.generate(...)   # one generate call per slot hold
            ...                               # Trajectory(trajectory_id=attempt.attempt_id,
                                              #   group_id, task_id, attempt=attempt.slot,
                                              #   retry=attempt.retry, seed=attempt.seed,
                                              #   launched_at=attempt.launched_at, ...)

    driver = CollectionDriver(SchedulerConfig(...), EpisodeRunner(...), task_ids, sink=sink)
    async with contextlib.aclosing(driver.batches()) as batches:
        async for batch in batches:           # Batch: groups, accounting, profile, meta
            path = write_batch(out_dir, batch)  # rollbank.batching.writer
            driver.ack(path)                  # consumed now (else: at the next iteration)

Module map: ``types`` (keys, specs, decisions, enums), ``config`` (pydantic sections),
``events`` (lifecycle events + ``EventSink``), ``batch`` (``Batch``, ``GroupResult``,
accounting, selection profile), ``ledger`` (exactly-once accounting), ``ready_bank``,
``scheduler`` (+ ``inference_slots``), ``profile``, ``driver``.
"""

from rollbank.scheduling.batch import (
    Batch,
    BatchAccounting,
    DistStats,
    GroupResult,
    SelectionProfile,
    Unreachable,
)
from rollbank.scheduling.config import AdvantageConfig, ReadyBankConfig, SchedulerConfig
from rollbank.scheduling.driver import AttemptRunner, CollectionDriver
from rollbank.scheduling.events import (
    AttemptCarried,
    AttemptEvent,
    AttemptFinished,
    AttemptWaste,
    BatchEvent,
    BatchHandoff,
    Event,
    EventKind,
    EventSink,
    FanoutSink,
    GroupEvent,
    ListSink,
    TaskUnreachable,
    WasteReason,
)
from rollbank.scheduling.ledger import AttemptState, Ledger, LedgerError
from rollbank.scheduling.ready_bank import ReadyBank
from rollbank.scheduling.scheduler import Scheduler
from rollbank.scheduling.types import (
    NULL_CONTEXT,
    AttemptContext,
    AttemptKey,
    AttemptSpec,
    SchedulingMode,
    StragglerPolicy,
)

__all__ = [
    "NULL_CONTEXT",
    "AdvantageConfig",
    "AttemptCarried",
    "AttemptContext",
    "AttemptEvent",
    "AttemptFinished",
    "AttemptKey",
    "AttemptRunner",
    "AttemptSpec",
    "AttemptState",
    "AttemptWaste",
    "Batch",
    "BatchAccounting",
    "BatchEvent",
    "BatchHandoff",
    "CollectionDriver",
    "DistStats",
    "Event",
    "EventKind",
    "EventSink",
    "FanoutSink",
    "GroupEvent",
    "GroupResult",
    "Ledger",
    "LedgerError",
    "ListSink",
    "ReadyBank",
    "ReadyBankConfig",
    "Scheduler",
    "SchedulerConfig",
    "SchedulingMode",
    "SelectionProfile",
    "StragglerPolicy",
    "TaskUnreachable",
    "Unreachable",
    "WasteReason",
]
