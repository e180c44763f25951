"""The asyncio driver: runs the pure :class:`~rollbank.scheduling.policy.scheduler.Scheduler` for real.

Owns the attempt tasks, the per-server inference slots and the verifier slots it lends runners
(both decided by the scheduler; the lending is :mod:`.driver_slots`), and the hand-off of batches.
One collector task (owned by :meth:`CollectionDriver.batches`, awaited on exit) asks the
scheduler for decisions, starts one task per :class:`Launch` inside its ``asyncio.TaskGroup``,
feeds results back, cancels on :class:`Abort`, and hands each
:class:`~rollbank.batching.batch.Batch` to the consumer through a one-place queue (so
collection goes on while the consumer trains on the previous batch, and pauses after that).

Invariants
- Every launched attempt ends exactly once: its runner returns (``finished``) or the driver
  cancels it (``aborted``); a runner that raises is recorded as ``infra_failure/host_error``.
- No task outlives :meth:`CollectionDriver.batches`: when the consumer stops iterating or an
  error escapes, remaining attempts are cancelled (and settled as waste) before it returns.
- Exactly-once hand-off: a batch's groups are consumed only when the consumer acknowledges
  the batch — by asking for the next one (the next iteration of :meth:`batches`), or
  explicitly with :meth:`CollectionDriver.ack` (by index, ``Batch`` or batch directory).
  Batches emitted ahead or never acknowledged go back to the bank when the iteration ends
  (settled ``unconsumed_at_close``; the groups are kept in ``scheduler.returned_at_close``).
  The ledger is checked at every emission, acknowledgement and at close; a violation raises
  :class:`~rollbank.scheduling.policy.ledger.LedgerError` out of the iteration.
- Results travel through a bounded queue (two places per sandbox slot: one for each running
  attempt, one for a result that arrived just as its attempt was aborted).
- With a capacity feed (a cluster backend), the sandbox slots follow it: each change is an
  input event to the scheduler (``on_capacity``); with 0 slots the loop waits for a node.
- With a server feed (managed servers still starting), the serving servers follow it the same
  way (``on_servers``), and ``on_servers`` callers (the router) learn each new set.
- An aborted attempt's sandbox slot is reused at once; the runner's own cleanup of the
  cancelled sandbox may briefly overlap the next attempt.
- A scheduler with a gate (the staleness gate) needs a ``scorer``: the driver then owns a
  :class:`~rollbank.scheduling.drivers.group_scoring.GroupScoring` that scores the groups the
  gate holds (its tasks count as work in flight); without a gate there is no scorer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import replace
from os import PathLike
from pathlib import Path
from typing import Protocol, TypeVar

from rollbank.batching.batch import Batch
from rollbank.clock import Clock, MonotonicClock
from rollbank.episodes.trajectory import Trajectory
from rollbank.errors import CollectionStalledError, SchedulingError
from rollbank.inference.protocol import ServerFeed
from rollbank.sandbox.protocol import CapacityFeed
from rollbank.scheduling.config import SchedulerConfig
from rollbank.scheduling.drivers.driver_slots import SlotLending
from rollbank.scheduling.drivers.group_scoring import GroupScoring
from rollbank.scheduling.drivers.host_error import host_error_trajectory
from rollbank.scheduling.drivers.scoring import PolicyScorer
from rollbank.scheduling.policy.events import Event, EventSink, ListSink
from rollbank.scheduling.policy.scheduler import Scheduler
from rollbank.scheduling.policy.scores import GroupScores
from rollbank.scheduling.policy.types import Abort, AttemptKey, AttemptSpec, EmitBatch, Launch

T = TypeVar("T")


class AttemptRunner(Protocol):
    """Runs one attempt end to end (sandbox, agent turns, verifier) and returns its record.

    Must not raise for episode failures (record an ``EpisodeOutcome`` instead); must clean
    up its sandbox when cancelled (``CancelledError`` is how aborts arrive).
    """

    async def run(self, attempt: AttemptSpec) -> Trajectory: ...


class CollectionDriver:
    """Collect ``config.num_batches`` batches by running ``runner`` under ``Scheduler`` policy.

    Usage::

        driver = CollectionDriver(config, runner, task_ids, sink=my_sink)
        async with contextlib.aclosing(driver.batches()) as batches:
            async for batch in batches:
                train_on(batch)

    ``task_ids`` is the task sequence: group ``seq`` runs ``task_ids[seq % len(task_ids)]``.
    ``sink`` receives every lifecycle event (see :mod:`rollbank.scheduling.policy.events`).
    ``capacity``, if given, replaces ``config.sandbox_slots`` by the backend's live slots.
    After the iteration ends, :attr:`scheduler` holds the closed ledger
    (``scheduler.bank.ledger``) and :attr:`batches_out` the batches acknowledged.
    A batch is acknowledged when the consumer asks for the next one, or earlier with
    :meth:`ack`; a consumer that stops iterating leaves its last batch unacknowledged unless it
    acked it (e.g. after writing it: ``driver.ack(path)``).
    """

    def __init__(
        self,
        config: SchedulerConfig,
        runner: AttemptRunner,
        task_ids: list[str],
        *,
        sink: EventSink | None = None,
        clock: Clock | None = None,
        scheduler: Scheduler | None = None,
        capacity: CapacityFeed | None = None,
        servers: ServerFeed | None = None,
        on_servers: Callable[[tuple[str, ...]], None] | None = None,
        scorer: PolicyScorer | None = None,
    ) -> None:
        self.config = config
        self.runner = runner
        self.clock: Clock = clock or MonotonicClock()
        self.sink: EventSink = sink or ListSink()
        self.scheduler = scheduler or Scheduler(config, task_ids, self.clock)
        if (scorer is None) != (self.scheduler.gate is None):
            raise ValueError("a scheduler with a gate needs a scorer, and only it takes one")
        self.scoring = None if scorer is None else GroupScoring(scorer, self._on_scores)
        self.capacity = capacity
        if capacity is not None:
            self.scheduler.on_capacity(capacity.capacity)
        self.servers = servers
        self.on_servers = on_servers
        if servers is not None:
            self._servers_changed(servers.ready)
        self.batches_out: list[Batch] = []  # acknowledged, in order
        self._emitted: dict[int, Batch] = {}  # emitted, awaiting acknowledgement
        self._tasks: dict[AttemptKey, asyncio.Task[None]] = {}
        # results of attempts; None = poll again (contention ended while extras were held)
        self._results: asyncio.Queue[tuple[AttemptKey, Trajectory] | None] = asyncio.Queue(
            maxsize=2 * config.sandbox_slots + 1
        )
        self._nudged = False
        self.lending = SlotLending(self.scheduler, flush_events=self._flush_events,
                                   nudge=self._nudge)

    # ------------------------------------------------------------ public
    async def batches(self, *, ahead: int = 1) -> AsyncGenerator[Batch, None]:
        """Yield batches as they become ready; cancel and settle everything when done.

        Collection runs in one owned task (attempts in its ``TaskGroup``) and keeps going
        while the consumer works on a batch, holding at most ``ahead`` batches undelivered
        (then it waits; a consumer that bounds how far collection runs ahead by other means,
        the async loop's admission gate, passes its own bound). Leaving
        the iteration (break, error, cancellation) cancels that task, which aborts every
        attempt still running and settles it as waste. Wrap in ``contextlib.aclosing`` when
        you may break out early, so this happens at once rather than at garbage collection.
        """
        if ahead < 1:
            raise ValueError(f"ahead must be >= 1, got {ahead}")
        out: asyncio.Queue[Batch | BaseException | None] = asyncio.Queue(maxsize=ahead)
        collector = asyncio.create_task(self._collect(out), name="rollbank-collector")
        try:
            while True:
                item = await out.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield item
                # the consumer asks for the next batch: it has this one
                if item.index in self._emitted:
                    self.ack(item.index)
        finally:
            try:
                if not collector.done():
                    collector.cancel()
                try:
                    await collector
                except asyncio.CancelledError:
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise  # our own consumer is being cancelled: let it propagate
            finally:
                self._emitted.clear()
                try:
                    self.scheduler.close()  # unacknowledged batches return; ledger checked
                finally:
                    self._flush_events()

    def ack(self, batch: int | Batch | str | PathLike[str]) -> None:
        """Acknowledge a batch (its index, the ``Batch``, or the batch directory written for
        it, ``batch-NNNNNN``): its groups become consumed. Acknowledging a batch that is not
        awaiting acknowledgement raises :class:`~rollbank.errors.SchedulingError`."""
        index = self._index_of(batch)
        emitted = self._emitted.pop(index, None)
        if emitted is None:
            raise SchedulingError(f"batch {index} is not awaiting acknowledgement")
        try:
            self.scheduler.ack(index)
        finally:
            self._flush_events()
        self.batches_out.append(emitted)

    def release(self, batch: int | Batch | str | PathLike[str]) -> None:
        """The consumer could not use a batch: its groups return to the bank and are offered
        again in the next batch."""
        index = self._index_of(batch)
        if self._emitted.pop(index, None) is None:
            raise SchedulingError(f"batch {index} is not awaiting acknowledgement")
        try:
            self.scheduler.release(index)
        finally:
            self._flush_events()
        self._nudge()  # returned groups may make a batch due

    def _index_of(self, batch: int | Batch | str | PathLike[str]) -> int:
        if isinstance(batch, int):
            return batch
        if isinstance(batch, Batch):
            return batch.index
        from rollbank.batching.writer import batch_dir_name

        name = Path(batch).name
        for index in self._emitted:
            if batch_dir_name(index) == name:
                return index
        raise SchedulingError(f"{batch}: no batch awaiting acknowledgement has this directory")

    # ------------------------------------------------------------ loop
    async def _collect(self, out: asyncio.Queue[Batch | BaseException | None]) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                follow = None if self.capacity is None else tg.create_task(
                    self._follow(self.capacity.watch(), self.scheduler.on_capacity),
                    name="rollbank-capacity")
                joins = None if self.servers is None else tg.create_task(
                    self._follow(self.servers.watch(), self._servers_changed), name="rollbank-servers")
                try:
                    await self._loop(tg, out)
                finally:
                    for t in (follow, joins):
                        if t is not None:
                            t.cancel()
                    self._abort_all()  # settling (and returning batches) is batches()'s job
                    self._flush_events()
        except Exception as exc:  # hand the failure to the consumer, which re-raises it
            await out.put(exc.exceptions[0] if isinstance(exc, ExceptionGroup)
                          and len(exc.exceptions) == 1 else exc)
            return
        await out.put(None)

    async def _loop(
        self, tg: asyncio.TaskGroup, out: asyncio.Queue[Batch | BaseException | None]
    ) -> None:
        while True:
            ready: list[Batch] = []
            for decision in self.scheduler.poll():
                if isinstance(decision, Launch):
                    self._start(tg, decision.spec)
                elif isinstance(decision, Abort):
                    self._abort(decision.key)
                elif isinstance(decision, EmitBatch):
                    ready.append(decision.batch)
            self._flush_events()
            for batch in ready:
                self._emitted[batch.index] = batch
                await out.put(batch)
            if self.scheduler.done:
                return
            waiting_for_nodes = ((self.capacity is not None and self.scheduler.sandbox_slots == 0)
                                 or not self.scheduler.inference.available)
            if not self._busy() and not self._nudged and not waiting_for_nodes:
                # nothing runs and the scheduler has nothing to launch: it cannot progress
                raise CollectionStalledError(
                    "collection stalled: no attempt in flight and none launchable")
            item = await self._next_result()
            if item is None:
                self._nudged = False
                continue
            key, traj = item
            if key in self._tasks:  # else: aborted after it had already returned
                del self._tasks[key]
                self.scheduler.on_finished(key, traj)
                if self.scoring is not None:  # groups the gate now holds are scored
                    self.scoring.start(self.scheduler.drain_scoring(), tg)

    async def _next_result(self) -> tuple[AttemptKey, Trajectory] | None:
        """The next result, or None (poll again) when the scheduler's wake-up time comes."""
        wake = self.scheduler.wake_at()
        if wake is None:
            return await self._results.get()
        try:
            return await asyncio.wait_for(self._results.get(), max(0.0, wake - self.clock.now()))
        except TimeoutError:
            return None

    def _busy(self) -> bool:
        """Work is under way that will wake the loop (attempts; groups being scored)."""
        return bool(self._tasks) or (self.scoring is not None and self.scoring.busy)

    def _on_scores(self, group_id: str, scores: GroupScores) -> None:
        """A held group's scores: the gate decides; wake the loop (re-runs, or a batch due)."""
        if self.scheduler.done:
            return
        self.scheduler.on_scored(group_id, scores)
        self._flush_events()
        self._nudge()

    async def _follow(self, changes: AsyncIterator[T], apply: Callable[[T], None]) -> None:
        """Apply each value of a feed (sandbox slots, serving servers) as an input event."""
        async for value in changes:
            apply(value)
            self._flush_events()
            self._nudge()

    def _servers_changed(self, servers: tuple[str, ...]) -> None:
        """New serving servers: the router (``on_servers``) first, then the scheduler."""
        if servers == self.scheduler.inference.servers:
            return
        if self.on_servers is not None:
            self.on_servers(servers)
        self.scheduler.on_servers(servers)

    def _start(self, tg: asyncio.TaskGroup, spec: AttemptSpec) -> None:
        spec = replace(spec, ctx=self.lending.context(spec.key))
        self._tasks[spec.key] = tg.create_task(self._run_one(spec), name=spec.attempt_id)

    async def _run_one(self, spec: AttemptSpec) -> None:
        try:
            traj = await self.runner.run(spec)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a runner bug must not crash the collector: record it
            traj = host_error_trajectory(spec, exc, self.clock.now())
        await self._results.put((spec.key, traj))

    def _abort(self, key: AttemptKey) -> None:
        task = self._tasks.pop(key, None)
        self.scheduler.on_aborted(key)
        self.lending.cancel(key)
        if task is not None:
            task.cancel()

    def _abort_all(self) -> None:
        if self.scoring is not None:
            self.scoring.cancel_all()
        for key in sorted(self._tasks):
            self._abort(key)

    def _nudge(self) -> None:
        """Wake the loop to poll again (contention ended, or groups returned to the bank)."""
        if not self._nudged:
            with contextlib.suppress(asyncio.QueueFull):  # a full queue wakes the loop anyway
                self._results.put_nowait(None)
                self._nudged = True

    def _flush_events(self) -> None:
        for event in self.scheduler.drain_events():
            self._emit(event)

    def _emit(self, event: Event) -> None:
        self.sink.emit(event)
