"""Group-aware collection: pure scheduler and ready bank, and the asyncio driver around them.

Public API (what the episode layer, metrics and CLI code against)::

    from rollbank.scheduling.driver import AttemptRunner, CollectionDriver
    from rollbank.scheduling.config import SchedulerConfig
    from rollbank.episodes.attempt import AttemptContext, AttemptSpec
    from rollbank.batching.batch import Batch, GroupResult
    from rollbank.scheduling.events import Event, EventKind, EventSink

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

Module map: ``types`` (decisions, enums; re-exports the attempt nouns of
``episodes.attempt``), ``config`` (pydantic sections), ``events`` (lifecycle events +
``EventSink``), ``ledger`` (exactly-once accounting), ``ready_bank``, ``scheduler`` (+
``inference_slots``), ``profile``, ``driver``. The batch a trainer receives (``Batch``,
``GroupResult``, accounting, selection profile) is ``rollbank.batching.batch``, a layer below.
The package itself imports nothing, so that loading ``scheduling.config`` stays cheap.
"""
