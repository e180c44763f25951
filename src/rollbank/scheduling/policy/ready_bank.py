"""The ready bank: groups enter when every sibling slot is terminal; trainers take them.

Owns group completion, in-slot retries and the attempt :class:`~rollbank.scheduling.policy.ledger.Ledger`.
Pure: no I/O, time from the injected clock, events appended to an outbox list.

Rules
- A slot is terminal when its latest attempt is valid (``model_success``/``model_failure``), or
  is ``infra_failure``/``unknown`` with ``max_retries`` re-runs spent. Before that, such an
  attempt is settled ``retried`` and a re-run of the same slot (same seed, ``retry + 1``) is
  returned as a :class:`Retry` decision, instead of discarding the group.
- A complete group with fewer than ``min_valid`` valid siblings is dropped (waste); a
  zero-variance group is flagged, and dropped only if ``filter_zero_variance``, or held back
  until released with ``dynamic_sampling`` (:mod:`rollbank.scheduling.policy.dynamic_sampling`).
- Advantages use valid siblings only (:mod:`rollbank.batching.advantages`).
- :meth:`ReadyBank.take` hands out complete groups oldest-launch first, regardless of the
  order in which they completed, as batch ``k``: they are ``delivered``, not consumed.
  :meth:`ReadyBank.ack` settles batch ``k``'s attempts ``consumed``;
  :meth:`ReadyBank.release` puts an unacknowledged batch's groups back in the bank, where
  the next :meth:`take` offers them again; :meth:`ReadyBank.close` releases every
  unacknowledged batch before settling what is left, so no group is lost or consumed
  without an acknowledgement.

A gate on complete groups (the staleness gate, :mod:`.gating`) is a strategy passed in
(``gate``, the :class:`~.group_gate.GroupGate` seam): when every slot of a group is terminal the
bank offers it the valid siblings, and a gate that holds the group keeps it open until it
re-runs slots (:meth:`ReadyBank.rerun_stale`) or completes it (:meth:`ReadyBank.complete`).

Invariant: every launched attempt is accounted for exactly once (``consumed``, ``retried``,
``waste``, or still open and therefore ``carried`` at a batch boundary); see
:meth:`ReadyBank.check`.
"""

from __future__ import annotations

from typing import Any

from rollbank.batching.advantages import grpo_advantages, is_valid, reward_of
from rollbank.batching.batch import GroupResult
from rollbank.clock import Clock
from rollbank.episodes.trajectory import Trajectory
from rollbank.scheduling.config import ReadyBankConfig
from rollbank.scheduling.policy.bank_records import (
    BankDecision,
    GroupDone,
    GroupRecord,
    GroupStatus,
    Retry,
    SlotRecord,
)
from rollbank.scheduling.policy.dynamic_sampling import HoldBack
from rollbank.scheduling.policy.events import (
    AttemptEvent,
    AttemptWaste,
    Event,
    EventKind,
    GroupEvent,
    WasteReason,
)
from rollbank.scheduling.policy.group_gate import GroupGate
from rollbank.scheduling.policy.ledger import AttemptState, Entry, Ledger, LedgerError
from rollbank.scheduling.policy.types import AttemptKey

__all__ = ["BankDecision", "GroupDone", "GroupStatus", "ReadyBank", "Retry"]


class ReadyBank:
    def __init__(
        self, config: ReadyBankConfig, clock: Clock, outbox: list[Event] | None = None,
        *, record_events: bool = True, gate: GroupGate | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.outbox: list[Event] = outbox if outbox is not None else []
        self._record = record_events  # False: build no event objects (long simulations)
        self.gate = gate  # holds complete groups until it completes them (None: no gate)
        self.ledger = Ledger()
        self._groups: dict[str, GroupRecord] = {}
        self._open: dict[str, GroupRecord] = {}  # open groups, in opening order
        self._ready: dict[str, GroupRecord] = {}  # complete groups in the bank
        self._dirty: set[str] = set()  # groups whose status changed since the last check
        self._delivered: dict[int, list[GroupRecord]] = {}  # batch index -> groups awaiting ack
        self.hold = HoldBack(config.dynamic_sampling)  # zero-variance groups held back

    # ------------------------------------------------------------ groups
    def open_group(self, group_id: str, task_id: str, seq: int) -> list[AttemptKey]:
        """Register a new group; returns the first attempt key of each slot."""
        if group_id in self._groups:
            raise ValueError(f"group {group_id} opened twice")
        keys = [AttemptKey(seq, s, 0, group_id) for s in range(self.config.group_size)]
        group = GroupRecord(group_id, task_id, seq, self.clock.now(), [SlotRecord(k) for k in keys])
        self._groups[group_id] = group
        self._open[group_id] = group
        return keys

    def status(self, group_id: str) -> GroupStatus:
        return self._groups[group_id].status

    def task_of(self, group_id: str) -> str:
        return self._groups[group_id].task_id

    def seq_of(self, group_id: str) -> int:
        return self._groups[group_id].seq

    def remaining(self, group_id: str) -> int:
        """Sibling slots of ``group_id`` not yet terminal (0 once the group is complete)."""
        group = self._groups[group_id]
        return len(group.slots) - group.terminal

    def is_open(self, group_id: str) -> bool:
        group = self._groups.get(group_id)
        return group is not None and group.status is GroupStatus.OPEN

    @property
    def recording(self) -> bool:
        """Are event objects built (False in long simulations)?"""
        return self._record

    def has_launched(self, group_id: str) -> bool:
        return bool(self._groups[group_id].attempts)

    @property
    def ready_count(self) -> int:
        return len(self._ready)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def _held(self) -> list[GroupResult]:
        if not self.hold.enabled:
            return []
        return [g.result for g in self._ready.values() if g.result and g.result.zero_variance]

    def releasing(self) -> bool:
        """May held zero-variance groups fill a batch now (always, without dynamic sampling)?"""
        return self.hold.releasing(self._held(), open_groups=len(self._open), now=self.clock.now())

    @property
    def releasable_count(self) -> int:
        """Ready groups a batch may take now (the held ones only once released)."""
        return len(self._ready) if self.releasing() else len(self._ready) - len(self._held())

    def release_at(self) -> float | None:
        """Clock time the held groups' time bound falls due (None: none pending)."""
        return None if self.releasing() else self.hold.release_at(self._held())

    def extra_allowance(self) -> int:
        """Groups the scheduler may admit beyond its pool while groups are held back."""
        return self.hold.extra_allowance(len(self._held()))

    def open_groups(self) -> list[str]:
        return list(self._open)

    # ------------------------------------------------------------ attempts
    def on_launched(self, key: AttemptKey) -> Entry:
        group = self._groups[key.group_id]
        if group.status is not GroupStatus.OPEN or group.slots[key.slot].current != key:
            raise LedgerError(f"{key.attempt_id} launched but is not its slot's current attempt")
        group.attempts.append(key)
        return self.ledger.launch(key, group.task_id, self.clock.now())

    def on_finished(self, key: AttemptKey, traj: Trajectory) -> BankDecision:
        """Record a returned attempt; maybe retry its slot; maybe complete its group."""
        group = self._groups[key.group_id]
        slot = group.slots[key.slot]
        if group.status is not GroupStatus.OPEN or slot.current != key or slot.terminal:
            raise LedgerError(f"{key.attempt_id} finished but its slot does not expect it")
        now = self.clock.now()
        valid = is_valid(traj)
        reward = traj.reward if valid else None
        self.ledger.finish(key, now, model_tokens=traj.num_model_tokens, reward=reward,
                           valid=valid)
        slot.result = traj
        if not valid and slot.retries < self.config.max_retries:
            self._settle(key, AttemptState.RETRIED, now)
            if self._record:
                self.outbox.append(self._attempt_event(EventKind.RETRIED, key))
            slot.retries += 1
            slot.current = AttemptKey(key.seq, key.slot, key.retry + 1, key.group_id)
            slot.result = None
            return Retry(slot.current, group.task_id)
        slot.terminal = True
        group.terminal += 1
        if group.terminal == len(group.slots):
            return self._all_terminal(group)
        return None

    def _all_terminal(self, group: GroupRecord) -> BankDecision:
        """Every slot is terminal: complete the group, unless the gate holds it."""
        if self.gate is not None:
            members = [(s.current, s.result, s.stale_retries) for s in group.slots
                       if s.result is not None and is_valid(s.result)]
            if self.gate.hold(group.group_id, members):
                return None
        return self._complete(group)

    def rerun_stale(self, key: AttemptKey) -> Retry:
        """The gate re-runs ``key``'s slot: ``key`` is settled ``retried``; the slot runs
        again with the same seed (``retry + 1``, one more staleness re-run)."""
        group = self._groups[key.group_id]
        slot = group.slots[key.slot]
        self._settle(key, AttemptState.RETRIED, self.clock.now())
        self.outbox.append(self._attempt_event(EventKind.RETRIED, key))
        slot.stale_retries += 1
        slot.current = AttemptKey(key.seq, key.slot, key.retry + 1, key.group_id)
        slot.result = None
        slot.terminal = False
        group.terminal -= 1
        return Retry(slot.current, group.task_id)

    def complete(self, group_id: str, excluded: frozenset[int] = frozenset()) -> GroupDone:
        """The gate completes a group it held; ``excluded`` slots leave it as waste."""
        return self._complete(self._groups[group_id], excluded)

    def abort_group(self, group_id: str, reason: WasteReason = WasteReason.ABORTED) -> list[AttemptKey]:
        """Abandon an open group: settle its launched attempts as waste; return those in flight."""
        group = self._groups[group_id]
        if group.status is not GroupStatus.OPEN:
            raise LedgerError(f"group {group_id} aborted while {group.status.value}")
        self._set_status(group, GroupStatus.ABORTED)
        in_flight = [k for k in group.attempts
                     if self.ledger.entries[k].state is AttemptState.IN_FLIGHT]
        for k in group.attempts:
            if self.ledger.entries[k].state not in (AttemptState.RETRIED, AttemptState.WASTE):
                self._waste(k, reason)
        return in_flight

    # ------------------------------------------------------------ completion
    def _complete(self, group: GroupRecord, excluded: frozenset[int] = frozenset()) -> GroupDone:
        """Complete ``group``; ``excluded`` slots (the staleness gate's) leave it as waste."""
        done = [(s.current, s.result) for s in group.slots if s.result is not None]
        if excluded:
            for k, _ in done:
                if k.slot in excluded:
                    self._waste(k, WasteReason.STALE_FINAL)
            done = [(k, t) for k, t in done if k.slot not in excluded]
        ok = [is_valid(t) for _, t in done]  # judged once per trajectory
        valid_keys = [k for (k, _), v in zip(done, ok, strict=True) if v]
        for (k, _), v in zip(done, ok, strict=True):
            if not v:
                self._waste(k, WasteReason.INFRA_FINAL)
        valid = [t for (_, t), v in zip(done, ok, strict=True) if v]
        # group_advantages of ``done``, its valid siblings already known
        cfg = self.config.advantages
        adv = grpo_advantages([reward_of(t, cfg) for t in valid], cfg) if valid else None
        drop: WasteReason | None = None
        why = ""
        if adv is None or len(valid) < self.config.min_valid:
            drop, why = WasteReason.GROUP_DROPPED, f"{len(valid)} valid < min_valid"
        elif adv.zero_variance and self.config.filter_zero_variance:
            drop, why = WasteReason.ZERO_VARIANCE, "zero variance"
        if self._record:
            self.outbox.append(self._group_event(group, adv, len(valid), drop, why))
        if drop is not None or adv is None:
            self._set_status(group, GroupStatus.DROPPED)
            for k in valid_keys:
                self._waste(k, drop or WasteReason.GROUP_DROPPED)
            return GroupDone(group.group_id, False, why)
        self.hold.on_complete(adv.zero_variance)
        self._set_status(group, GroupStatus.READY)
        group.valid_keys = valid_keys
        group.result = GroupResult(
            group_id=group.group_id, task_id=group.task_id, seq=group.seq,
            trajectories=tuple(valid), rewards=adv.rewards, advantages=adv.advantages,
            zero_variance=adv.zero_variance, size=len(group.slots),
            infra_final=len(done) - len(valid_keys), retries=sum(s.retries + s.stale_retries for s in group.slots),
            launched_at=group.launched_at, completed_at=self.clock.now(),
        )
        return GroupDone(group.group_id, True)

    def take(self, max_groups: int, batch: int, *, release: bool = False) -> list[GroupResult]:
        """Hand out up to ``max_groups`` ready groups, oldest launch first, as batch ``batch``
        (dynamic sampling: groups with variance first, held ones only when released, or
        ``release``). They are ``delivered``: consumed by :meth:`ack`, or back in the bank by
        :meth:`release`."""
        if batch in self._delivered:
            raise LedgerError(f"batch {batch} handed out twice")
        by_id = {g.group_id: g for g in self._ready.values() if g.result is not None}
        chosen = self.hold.choose([g.result for g in by_id.values() if g.result is not None],
                                  max_groups, release=release or self.releasing())
        ready = [by_id[r.group_id] for r in chosen]
        now = self.clock.now()
        out = []
        for g in ready:
            if g.result is None:
                raise LedgerError(f"ready group {g.group_id} has no result")
            out.append(g.result)
            for k in g.valid_keys:
                self.ledger.deliver(k, now)
            g.batch = batch
            self._set_status(g, GroupStatus.DELIVERED)
        self._delivered[batch] = ready  # even empty: the batch is acknowledged all the same
        return out

    def unacknowledged(self) -> list[int]:
        """Indices of batches handed out and neither acknowledged nor released."""
        return sorted(self._delivered)

    def ack(self, batch: int) -> list[AttemptKey]:
        """The consumer has batch ``batch``: settle its attempts consumed; return them."""
        groups = self._delivered.pop(batch, None)
        if groups is None:
            raise LedgerError(f"batch {batch} acknowledged but not awaiting acknowledgement")
        now = self.clock.now()
        keys = []
        for g in groups:
            for k in g.valid_keys:
                self._settle(k, AttemptState.CONSUMED, now)
                keys.append(k)
            self._set_status(g, GroupStatus.CONSUMED)
        return keys

    def release(self, batch: int) -> list[GroupResult]:
        """Batch ``batch`` was not taken: its groups return to the bank (offered again)."""
        groups = self._delivered.pop(batch, None)
        if groups is None:
            raise LedgerError(f"batch {batch} released but not awaiting acknowledgement")
        out = []
        for g in groups:
            if g.result is None:
                raise LedgerError(f"delivered group {g.group_id} has no result")
            out.append(g.result)
            for k in g.valid_keys:
                self.ledger.undeliver(k)
            g.batch = None
            self._set_status(g, GroupStatus.READY)
        return out

    def consumed_entries(self, group_ids: list[str]) -> list[Entry]:
        """Ledger entries of the attempts delivered in these (taken) groups."""
        return [self.ledger.entries[k] for gid in group_ids for k in self._groups[gid].valid_keys]

    def close(self) -> list[GroupResult]:
        """End of collection: unacknowledged batches return to the bank, then everything
        unsettled becomes waste (``unconsumed_at_close``). Returns the groups that were
        complete but never acknowledged (for a caller to keep or offer again)."""
        for b in self.unacknowledged():
            self.release(b)
        returned = [g.result for g in self._ready.values()
                    if g.status is GroupStatus.READY and g.result is not None]
        for g in [*self._open.values(), *self._ready.values()]:
            self._set_status(g, GroupStatus.ABORTED)
        for entry in self.ledger.unsettled():
            self._waste(entry.key, WasteReason.UNCONSUMED_AT_CLOSE)
        return returned

    def check(self, *, full: bool = False) -> None:
        """Assert the accounting invariant (raises :class:`LedgerError`): incrementally (the
        groups moved since the last check and those awaiting acknowledgement), or ``full``."""
        self.ledger.check(full=full)
        groups = list(self._groups.values()) if full else [
            *(self._groups[gid] for gid in self._dirty),
            *(g for gs in self._delivered.values() for g in gs)]
        self._dirty.clear()
        open_states = (AttemptState.IN_FLIGHT, AttemptState.FINISHED)
        batch_of = {x.group_id: b for b, gs in self._delivered.items() for x in gs}
        wants = {GroupStatus.DELIVERED: AttemptState.DELIVERED,
                 GroupStatus.CONSUMED: AttemptState.CONSUMED}
        entries = self.ledger.entries
        for g in groups:
            want = wants.get(g.status)
            if want is not None:
                for k in g.valid_keys:
                    if entries[k].state is not want:
                        raise LedgerError(f"group {g.group_id} is {g.status.value} but its "
                                          f"attempts are not all {want.value}")
            awaiting = g.batch is not None and batch_of.get(g.group_id) == g.batch
            if (g.status is GroupStatus.DELIVERED) != awaiting:
                raise LedgerError(f"group {g.group_id} is {g.status.value}, batch {g.batch}")
            if g.status in (GroupStatus.OPEN, GroupStatus.READY):
                continue
            stranded = [k.attempt_id for k in g.attempts
                        if self.ledger.entries[k].state in open_states]
            if stranded:  # a group that left the bank must have settled all its attempts
                raise LedgerError(f"group {g.group_id} is {g.status.value} but {stranded} open")

    # ------------------------------------------------------------ helpers
    def _set_status(self, group: GroupRecord, status: GroupStatus) -> None:
        """Move a group; once it leaves the bank, drop its trajectories (long runs stay small)."""
        group.status = status
        self._dirty.add(group.group_id)
        self._open.pop(group.group_id, None)
        self._ready.pop(group.group_id, None)
        if status is GroupStatus.OPEN:
            self._open[group.group_id] = group
        if status is GroupStatus.READY:
            self._ready[group.group_id] = group
        if status in (GroupStatus.OPEN, GroupStatus.READY, GroupStatus.DELIVERED):
            return
        if self.gate is not None:
            self.gate.forget(group.group_id)
        group.result = None
        for slot in group.slots:
            slot.result = None

    def _settle(self, key: AttemptKey, state: AttemptState, now: float) -> None:
        self.ledger.settle(key, state, now)

    def _waste(self, key: AttemptKey, reason: WasteReason) -> None:
        now = self.clock.now()
        entry = self.ledger.settle(key, AttemptState.WASTE, now, reason)
        if not self._record:
            return
        base = self._attempt_event(EventKind.WASTE, key)
        self.outbox.append(AttemptWaste(
            kind=EventKind.WASTE, t=now, attempt_id=base.attempt_id, group_id=base.group_id,
            task_id=base.task_id, slot=base.slot, retry=base.retry, seq=base.seq,
            reason=reason, held_s=entry.held_s(now),
        ))

    def _group_event(self, group: GroupRecord, adv: Any, valid: int, drop: WasteReason | None,
                     why: str) -> GroupEvent:
        return GroupEvent(
            kind=EventKind.GROUP_DROPPED if drop else EventKind.GROUP_READY,
            t=self.clock.now(), group_id=group.group_id, task_id=group.task_id, seq=group.seq,
            size=len(group.slots), valid=valid,
            zero_variance=adv.zero_variance if adv is not None else False, why=why,
            held=bool(self.hold.enabled and drop is None and adv is not None and adv.zero_variance),
        )

    def _attempt_event(self, kind: EventKind, key: AttemptKey) -> AttemptEvent:
        return AttemptEvent(
            kind=kind, t=self.clock.now(), attempt_id=key.attempt_id, group_id=key.group_id,
            task_id=self._groups[key.group_id].task_id, slot=key.slot, retry=key.retry,
            seq=key.seq,
        )
