"""The scheduler: a pure state machine deciding launches, aborts and batch emission.

It owns admission into the pool of groups (the next group: :mod:`.admission`), three
capacities as components passed in or built from the config (:mod:`.capacities`: sandbox
slots, which may follow a cluster's nodes; inference slots per server; verifier slots),
sibling priority, the straggler policy and batch assembly. It does no I/O: the driver reports events (:meth:`Scheduler.on_finished`, ...) and applies the decisions
returned by :meth:`Scheduler.poll` (:class:`Launch`, :class:`Abort`, :class:`EmitBatch`).

Policy (``optimized`` mode)
- Admission keeps ``pool_groups`` (G') groups in the pool: a group is in the pool from its
  admission until it is consumed, dropped or aborted. Each admitted group queues its n slots.
- A waiting attempt gets a sandbox slot, and a waiting generate call gets an inference slot,
  in priority order ``(seq, slot, retry)``: siblings and re-runs of older groups go first, so
  started groups finish before new ones start. Retries and re-queued tasks keep their
  original ``seq``: long or unlucky work keeps its place (FIFO by original launch).
- Work-conserving over-provisioning (``hold_extras_when_contended``): the attempts of the
  "extra" groups — open groups beyond the ones the next batch still needs, by ``seq`` — are
  launched only while no generate call waits for an inference slot and (unless
  ``hold_extras_for_verifier`` is off) no verifier waits for a verifier slot. When inference
  or verification is the contended resource, extras would only slow the groups the batch
  needs; when not (a straggler tail, tool-bound episodes), they use capacity left idle.
- Straggler policy once G groups are ready: ``carry`` emits and lets unfinished attempts run
  on into the next batch; ``abort`` emits and cancels the open groups (waste), re-queuing
  their tasks at their old place if ``requeue_aborted`` — at most ``max_requeues`` times,
  after which the task is recorded unreachable within the budget (``task_unreachable``
  event, ``Batch.unreachable``); ``wait`` emits only when no group of the pool is still open.
- A poll emits due batches first and launches after, so nothing launched in a poll is
  aborted by that same poll.
- Hand-off: an emitted batch's groups are *delivered*; they become consumed only when the
  consumer acknowledges the batch (:meth:`Scheduler.ack`), or return to the bank
  (:meth:`Scheduler.release`, and at :meth:`Scheduler.close`). The ledger is checked at every
  emission, acknowledgement and at close.
- ``naive`` mode: see :class:`~rollbank.scheduling.config.SchedulingMode`.
- A gate on complete groups (``gate``, :mod:`.group_gate`; the staleness gate,
  :mod:`.gating`) is passed in and handed to the ready bank: held groups go to the driver
  (:meth:`Scheduler.drain_scoring`), their scores come back (:meth:`Scheduler.on_scored`),
  re-run slots wait like infra retries (same seed, the group's old place), and every emitted
  batch passes through the gate (its columns).

Invariants
- An attempt launches only while fewer than ``sandbox_slots`` run (a capacity drop aborts
  nothing: running attempts finish); granted inference slots never exceed
  ``inference_slots_per_server`` on any server.
- Every launched attempt is in the ready bank's ledger exactly once (see ready_bank).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any

from rollbank.batching.batch import GroupResult, Unreachable
from rollbank.clock import Clock
from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.scheduling.config import SchedulerConfig, SchedulingMode, StragglerPolicy
from rollbank.scheduling.policy.admission import GroupSource
from rollbank.scheduling.policy.bank_records import GroupDone
from rollbank.scheduling.policy.capacities import (
    InferenceCapacity,
    SandboxCapacity,
    Slots,
    VerifierCapacity,
    default_capacities,
)
from rollbank.scheduling.policy.events import (
    AttemptEvent,
    AttemptFinished,
    BatchHandoff,
    CapacityChanged,
    DiscardOutbox,
    Event,
    EventKind,
    ServersChanged,
    TaskUnreachable,
)
from rollbank.scheduling.policy.group_gate import GroupGate, NeedsScoring
from rollbank.scheduling.policy.ready_bank import GroupStatus, ReadyBank, Retry
from rollbank.scheduling.policy.scores import GroupScores
from rollbank.scheduling.policy.types import (
    Abort,
    AttemptKey,
    AttemptSpec,
    Decision,
    EmitBatch,
    Launch,
)
from rollbank.scheduling.policy.window import close_window


def attempt_seed(base: int, seq: int, slot: int) -> int:
    """Deterministic per-(group seq, slot) seed, identical across arms and retries."""
    return (base * 1_000_003 + seq * 1_009 + slot) % (2**31 - 1)


class Scheduler:
    """Launch policy for one collection (see the module docstring); owns its ready bank and
    its capacities (``sandbox``, ``inference``, ``verifier``: given, or built from ``config``
    by :func:`~.capacities.default_capacities`)."""

    def __init__(
        self,
        config: SchedulerConfig,
        task_ids: Sequence[str],
        clock: Clock,
        *,
        record_events: bool = True,
        sandbox: SandboxCapacity | None = None,
        inference: InferenceCapacity | None = None,
        verifier: VerifierCapacity | None = None,
        gate: GroupGate | None = None,
    ) -> None:
        self.config = config.effective()
        self._naive = self.config.mode is SchedulingMode.NAIVE  # the mode never changes
        self.groups = GroupSource(task_ids, max_groups=self.config.max_groups,
                                  requeue_aborted=self.config.requeue_aborted,
                                  max_requeues=self.config.max_requeues)
        self.task_ids = self.groups.task_ids
        self.clock = clock
        self._record = record_events  # False (long simulations): no event objects are built
        self.outbox: list[Event] = [] if record_events else DiscardOutbox()
        self.gate = gate
        self.bank = ReadyBank(self.config.bank, clock, self.outbox, record_events=record_events,
                              gate=gate)
        self.done = False
        self.batch_index = 0
        self._queue: list[tuple[AttemptKey, str]] = []  # heap: attempts waiting for a sandbox
        self._running: dict[AttemptKey, str] = {}  # key -> task_id
        self._window_start: float | None = None
        self._window_admitted = False  # naive: this window's G groups were admitted
        defaults = default_capacities(self.config)
        self.sandbox: SandboxCapacity = sandbox if sandbox is not None else defaults[0]
        self.inference: InferenceCapacity = inference if inference is not None else defaults[1]
        self.verifier: VerifierCapacity = verifier if verifier is not None else defaults[2]
        self.slots = Slots(self.inference, self.verifier, self.bank.remaining)  # lent by the driver
        self._holding = False  # extras were held back at the last launch for contention
        self.unreachable: list[Unreachable] = self.groups.unreachable  # re-queue cap reached
        self.returned_at_close: list[GroupResult] = []

    def resume_at(self, batch_index: int, next_seq: int) -> None:
        """Continue a crashed run (before the first poll): the next batch is ``batch_index``
        (the run stops at ``num_batches`` as before) and new groups start at ``next_seq``
        (fresh group ids and seeds, the task sequence continues)."""
        if self.groups.created or self.batch_index or self._queue:
            raise ValueError("resume_at must be called before the scheduler starts")
        if batch_index < 0 or next_seq < 0:
            raise ValueError("resume_at needs non-negative indices")
        self.batch_index = batch_index
        self.groups.created = next_seq

    @property
    def naive(self) -> bool:
        return self._naive

    @property
    def running(self) -> frozenset[AttemptKey]:
        return frozenset(self._running)

    # ------------------------------------------------------------ decisions
    def poll(self) -> list[Decision]:
        """Decisions to apply now: launches into free sandbox slots, aborts, ready batches."""
        out: list[Decision] = []
        if self.done:
            return out
        # emission first, launches after: an attempt launched in this poll is never aborted
        # by a batch emitted in the same poll (``abort`` would waste work never run)
        self._admit()
        while not self.done and self._batch_due():
            self._emit(out)
            if not self.done:
                self._admit()
        if not self.done:
            self._launch(out)
        if self.gate is not None:
            gate = self.gate
            return [EmitBatch(gate.batch(d.batch)) if isinstance(d, EmitBatch) else d for d in out]
        return out

    def drain_events(self) -> list[Event]:
        """Lifecycle events produced since the last call, in order."""
        events, self.outbox[:] = list(self.outbox), []
        return events

    # ------------------------------------------------------------ capacities
    @property
    def sandbox_slots(self) -> int:
        """Attempts that may hold a sandbox at once, now."""
        return self.sandbox.slots

    def on_capacity(self, sandbox_slots: int) -> None:
        """The sandbox capacity is now ``sandbox_slots`` (nodes joined or left; 0 allowed)."""
        if self.sandbox.resize(sandbox_slots):
            self.outbox.append(CapacityChanged(kind=EventKind.CAPACITY, t=self.clock.now(),
                                               sandbox_slots=self.sandbox.slots))

    def on_servers(self, servers: Sequence[str]) -> None:
        """The inference servers serving now (each brings ``inference_slots_per_server``)."""
        if self.inference.set_servers(servers):
            self.outbox.append(ServersChanged(kind=EventKind.SERVERS, t=self.clock.now(),
                                              servers=tuple(servers)))

    # ------------------------------------------------------------ the gate's scoring
    def drain_scoring(self) -> list[NeedsScoring]:
        """Complete groups the gate holds for scores (the driver scores them and calls
        :meth:`on_scored`); none without a gate."""
        return [] if self.gate is None else self.gate.drain()

    def on_scored(self, group_id: str, scores: GroupScores) -> list[Retry] | GroupDone | None:
        """The scores of a group handed out by :meth:`drain_scoring`: the gate decides;
        re-runs wait for a sandbox slot at the group's place (poll to launch them)."""
        if self.gate is None:
            raise ValueError("on_scored: this scheduler has no gate")
        out = self.gate.on_scored(self.bank, group_id, scores)
        if isinstance(out, list):
            for r in out:
                heapq.heappush(self._queue, (r.key, r.task_id))
        return out

    # ------------------------------------------------------------ reports from the driver
    def on_started(self, key: AttemptKey) -> None:
        if key in self._running:
            self.outbox.append(self._event(EventKind.STARTED, key))

    def on_finished(self, key: AttemptKey, traj: Trajectory) -> None:
        """The runner returned ``traj`` for ``key`` (ignored if the attempt was aborted)."""
        if self._running.pop(key, None) is None:
            return
        if self._record:
            launched_at = self.bank.ledger.entries[key].launched_at
            self.outbox.append(AttemptFinished(
                kind=EventKind.FINISHED, t=self.clock.now(), **self._ids(key),
                outcome=_outcome_of(traj), duration_s=self.clock.now() - launched_at,
                model_tokens=traj.num_model_tokens, total_tokens=len(traj.token_ids),
                servers=tuple(traj.servers),
            ))
        decision = self.bank.on_finished(key, traj)
        if isinstance(decision, Retry):
            heapq.heappush(self._queue, (decision.key, decision.task_id))
        self.slots.returned(key)  # its group's verifier waiters are re-ranked

    def on_aborted(self, key: AttemptKey) -> None:
        """The driver cancelled ``key`` (after an :class:`Abort`, or while closing)."""
        if self._running.pop(key, None) is not None:
            self.slots.returned(key)
            self.outbox.append(self._event(EventKind.ABORTED, key))

    def ack(self, batch_index: int) -> list[AttemptKey]:
        """The consumer acknowledged batch ``batch_index``: its groups become consumed.

        Checks the ledger (raises :class:`~rollbank.scheduling.policy.ledger.LedgerError`)."""
        keys = self.bank.ack(batch_index)
        self.outbox.append(BatchHandoff(
            kind=EventKind.BATCH_ACKED, t=self.clock.now(), batch_index=batch_index,
            attempt_ids=tuple(k.attempt_id for k in keys),
        ))
        self.bank.check()
        return keys

    def release(self, batch_index: int) -> list[str]:
        """Batch ``batch_index`` was not taken: its groups return to the bank and are offered
        again in the next batch. Returns their group ids."""
        groups = self.bank.release(batch_index)
        self.outbox.append(BatchHandoff(
            kind=EventKind.BATCH_RETURNED, t=self.clock.now(), batch_index=batch_index,
            attempt_ids=tuple(t.trajectory_id for g in groups for t in g.trajectories),
        ))
        self.bank.check()
        return [g.group_id for g in groups]

    def unacknowledged(self) -> list[int]:
        """Batches emitted and neither acknowledged nor released."""
        return self.bank.unacknowledged()

    def close(self) -> None:
        """End of collection: nothing more launches; unacknowledged batches return to the
        bank (kept in :attr:`returned_at_close`); everything unsettled becomes waste; the
        ledger is checked (raises :class:`~rollbank.scheduling.policy.ledger.LedgerError`)."""
        for key in sorted(self._running):
            self.on_aborted(key)
        self._queue.clear()
        for b in self.bank.unacknowledged():
            self.release(b)
        self.returned_at_close = self.bank.close()
        self.done = True
        self.bank.check(full=True)

    # ------------------------------------------------------------ internals
    def _pool_size(self) -> int:
        """Groups in the pool; held zero-variance groups (dynamic sampling) leave room for
        up to ``max_extra_groups`` replacements."""
        return self.bank.open_count + self.bank.ready_count - self.bank.extra_allowance()

    def _admit(self) -> None:
        cfg, groups = self.config, self.groups
        if self.naive:
            if self._window_admitted:
                return
            self._window_admitted = True
            for _ in range(cfg.groups_per_batch):
                if groups.can_create():
                    self._open(*groups.next(new_only=True))
            return
        while self._pool_size() < cfg.pool_groups and groups.has_next():
            self._open(*groups.next())

    def _open(self, group_id: str, task_id: str, seq: int) -> None:
        for key in self.bank.open_group(group_id, task_id, seq):
            heapq.heappush(self._queue, (key, task_id))

    def wake_at(self) -> float | None:
        """Clock time to poll again even if no result arrives (a held group's time bound)."""
        return None if self.done else self.bank.release_at()

    @property
    def holding_extras(self) -> bool:
        """Extra groups' attempts were held back for contention (poll again when it ends)."""
        return self._holding

    def _extra_groups(self) -> set[str]:
        """Open groups beyond those the next batch still needs (the latest by ``seq``)."""
        need = max(0, self.config.groups_per_batch - self.bank.releasable_count)
        by_seq = sorted(self.bank.open_groups(), key=self.bank.seq_of)
        return set(by_seq[need:])

    def _launch(self, out: list[Decision]) -> None:
        queue, running, bank, cfg = self._queue, self._running, self.bank, self.config
        slots = self.sandbox.slots
        self._holding = False
        if not queue or len(running) >= slots:
            return  # nothing to launch (and so nothing held back)
        now = self.clock.now()
        hold = not self._naive and cfg.hold_extras_when_contended and self.slots.extras_contended()
        extras = self._extra_groups() if hold else set()
        seed_base, group_size, record = cfg.seed, cfg.bank.group_size, self._record
        inference = self.inference
        while queue and len(running) < slots and inference.available:
            key, task_id = heapq.heappop(queue)
            if bank.status(key.group_id) is not GroupStatus.OPEN:
                continue  # its group was aborted while it waited
            if extras and key.group_id in extras:
                # every key after it in the heap has a later seq: all extras, all held
                heapq.heappush(queue, (key, task_id))
                self._holding = True
                break
            if self._window_start is None:
                self._window_start = now
            bank.on_launched(key)
            running[key] = task_id
            seed = attempt_seed(seed_base, key.seq, key.slot)
            spec = AttemptSpec(key, task_id, seed, group_size, now)
            if record:
                self.outbox.append(self._event(EventKind.LAUNCHED, key))
            out.append(Launch(spec))

    def _exhausted(self) -> bool:
        """Nothing runs, nothing waits, nothing more may be admitted."""
        return (not self._running and not self._queue  # cheapest first: usually decides
                and not self.groups.has_next())

    def _batch_due(self) -> bool:
        g = self.config.groups_per_batch
        ready = self.bank.releasable_count
        open_groups = self.bank.open_count > 0
        if self.naive:
            return self._window_admitted and not open_groups
        if self._exhausted():
            return True
        if self.config.straggler is StragglerPolicy.WAIT:
            return ready >= g and not open_groups
        return ready >= g

    def _emit(self, out: list[Decision]) -> None:
        cfg = self.config
        now = self.clock.now()
        exhausted = self._exhausted()
        if not self.bank.ready_count and exhausted:  # nothing left: stop without an empty batch
            self.done = True
            return
        groups = self.bank.take(cfg.groups_per_batch, self.batch_index, release=exhausted)
        unreachable: list[Unreachable] = []
        if cfg.straggler is StragglerPolicy.ABORT:
            for gid in self.bank.open_groups():
                if not self.bank.has_launched(gid):
                    continue  # not started: nothing to abort, it keeps its place in the pool
                u = self._abort_straggler(gid, out)
                if u is not None:
                    unreachable.append(u)
        start = self._window_start if self._window_start is not None else now
        batch, events = close_window(self.bank, groups, index=self.batch_index, window_start=start,
                                     now=now, config=cfg, unreachable=unreachable, ids=self._ids,
                                     record=self._record)
        self.outbox.extend(events)
        self.bank.check()  # every hand-off: a broken invariant stops the run
        out.append(EmitBatch(batch))
        self.batch_index += 1
        self._window_start = now
        self._window_admitted = False
        if self.batch_index >= cfg.num_batches or exhausted:
            self.done = True

    def _abort_straggler(self, gid: str, out: list[Decision]) -> Unreachable | None:
        """Abort open group ``gid``; re-queue its task, or give up on it at the cap."""
        now = self.clock.now()
        seq = self.bank.seq_of(gid)
        queued = [q for q in self._queue if q[0].group_id != gid]  # never launched: forget
        if len(queued) != len(self._queue):
            heapq.heapify(queued)
            self._queue = queued
        for key in self.bank.abort_group(gid):
            self._running.pop(key, None)
            self.slots.returned(key)
            self.groups.attempt_aborted(seq, now - self.bank.ledger.entries[key].launched_at)
            self.outbox.append(self._event(EventKind.ABORTED, key))
            out.append(Abort(key, "straggler policy abort"))
        u = self.groups.aborted(gid, self.bank.task_of(gid), seq)
        if u is None:
            return None
        self.outbox.append(TaskUnreachable(kind=EventKind.TASK_UNREACHABLE, t=now, **u.to_dict()))
        return u

    def _ids(self, key: AttemptKey) -> dict[str, Any]:
        return {"attempt_id": key.attempt_id, "group_id": key.group_id,
                "task_id": self.bank.task_of(key.group_id), "slot": key.slot,
                "retry": key.retry, "seq": key.seq}

    def _event(self, kind: EventKind, key: AttemptKey) -> AttemptEvent:
        return AttemptEvent(kind=kind, t=self.clock.now(), **self._ids(key))


def _outcome_of(traj: Trajectory) -> EpisodeOutcome:
    if traj.outcome is not None:
        return traj.outcome
    return EpisodeOutcome.of(Reason.UNATTRIBUTED, note="runner returned no outcome")
