"""Group-aware collection: pure scheduler and ready bank, and the asyncio driver around them.

Public API (what the episode layer, metrics and CLI code against)::

    from rollbank.scheduling.drivers.driver import AttemptRunner, CollectionDriver
    from rollbank.scheduling.config import SchedulerConfig
    from rollbank.episodes.attempt import AttemptContext, AttemptSpec
    from rollbank.batching.batch import Batch, GroupResult
    from rollbank.scheduling.policy.events import Event, EventKind, EventSink

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

Layout, by role: ``policy/`` (pure state machines over an injected clock, no I/O: ``scheduler``
and its capacities, ``ready_bank``, ``ledger``, ``window``, ``types``, ``events``, the gated
scheduler and bank), ``drivers/`` (thin asyncio drivers that run the policy: ``driver``,
``gated_driver``, the scorers), ``sim/`` (the policy in virtual time: ``simulate``,
``sim_model``), and ``config`` (pydantic sections). ``policy`` imports neither ``drivers`` nor
``sim``. The batch a trainer receives (``Batch``, ``GroupResult``, accounting, selection
profile) is ``rollbank.batching.batch``, a layer below.
The package itself imports nothing, so that loading ``scheduling.config`` stays cheap.
"""
