"""The ready bank with the staleness gate: a complete group is scored before it is released.

Pure, like :class:`~rollbank.scheduling.ready_bank.ReadyBank` (decisions as data, events in
the outbox, time from the clock). The scoring I/O is the driver's
(:mod:`rollbank.scheduling.gated_driver`).

Rules (docs/staleness.md, "What the ready bank must do")
- When every slot of a group is terminal, the group is not completed: it stays ``open`` and
  a :class:`NeedsScoring` (its valid siblings and their staleness re-runs so far) is queued
  for the driver (:meth:`GatedReadyBank.drain_scoring`). A group without valid siblings
  needs no scoring and completes (dropped) at once.
- :meth:`GatedReadyBank.on_scored` runs the pure gate (:func:`rollbank.staleness.rows.judge_group`)
  on the current policy's log-probs. One ``gated`` event per judged attempt. Every ``retry``
  slot is handled like an infra retry: its attempt is settled ``retried`` (a ``retried``
  event), the slot re-runs with the same seed (``retry + 1``, ``stale_retries + 1``) and the
  :class:`~rollbank.scheduling.ready_bank.Retry` keys are returned for the scheduler to
  launch; when they finish, the whole group is scored and judged again (the policy may have
  moved meanwhile). Without a retry the group completes with the kept siblings only
  (``exclude`` slots: waste ``stale_final``); advantages are over the kept siblings.
- A scoring result for a group that is no longer waiting for one (aborted by the straggler
  policy, or closed) is ignored.
- :attr:`GatedReadyBank.counters` counts the gate's decisions since the last
  :meth:`GatedReadyBank.take_counters`: every ``retry`` verdict when it is made, every other
  verdict once, when its group completes.

Invariant: the ledger's exactly-once accounting holds (a re-run slot's attempt is settled
``retried`` exactly once, an excluded one ``waste`` exactly once).
"""

from __future__ import annotations

from dataclasses import dataclass

from rollbank.batching.advantages import is_valid
from rollbank.clock import Clock
from rollbank.episodes.trajectory import Trajectory
from rollbank.scheduling.config import ReadyBankConfig
from rollbank.scheduling.events import AttemptEvent, Event, EventKind
from rollbank.scheduling.ledger import AttemptState
from rollbank.scheduling.ready_bank import (
    BankDecision,
    GroupDone,
    GroupStatus,
    ReadyBank,
    Retry,
    _Group,
)
from rollbank.scheduling.scoring import GroupScores
from rollbank.scheduling.types import AttemptKey
from rollbank.staleness.config import StalenessConfig
from rollbank.staleness.gate import GateCounters, GateDecision, StalenessGate, Verdict
from rollbank.staleness.rows import GroupMember, JudgedGroup, judge_group


@dataclass(frozen=True)
class NeedsScoring:
    """Score these valid siblings of ``group_id`` with the current policy, then report the
    result with :meth:`GatedReadyBank.on_scored`."""

    group_id: str
    keys: tuple[AttemptKey, ...]
    trajectories: tuple[Trajectory, ...]
    stale_retries: tuple[int, ...]  # per member: staleness re-runs of its slot so far


@dataclass(frozen=True)
class GatedGroup:
    """What the gate decided for a released group (kept until the group leaves the bank)."""

    judged: JudgedGroup
    scores: GroupScores
    stale_retries: dict[str, int]  # trajectory id -> staleness re-runs of its slot


@dataclass(frozen=True, kw_only=True)
class AttemptGated(AttemptEvent):
    """``gated``: the staleness gate's decision for one valid attempt (``verdict`` admit /
    downweight / retry / exclude). ``scorer_version`` is the version that scored it."""

    verdict: str
    weight: float
    reasons: tuple[str, ...]
    rare_success: bool
    k3: float | None
    ess: float | None
    geo_ratio: float | None
    version_lag: int
    scorer: str
    scorer_version: int
    stale_retries: int
    unmeasured_why: str = ""


class GatedReadyBank(ReadyBank):
    """A :class:`ReadyBank` whose complete groups pass the staleness gate first."""

    def __init__(self, config: ReadyBankConfig, clock: Clock, outbox: list[Event] | None = None,
                 *, staleness: StalenessConfig, record_events: bool = True) -> None:
        super().__init__(config, clock, outbox, record_events=record_events)
        self.staleness = staleness
        self.gate = StalenessGate(staleness.gate)
        self.counters = GateCounters()
        self._pending: list[NeedsScoring] = []
        self._scoring: dict[str, NeedsScoring] = {}  # group id -> members awaiting scores
        self._gated: dict[str, GatedGroup] = {}  # released groups' decisions

    # ------------------------------------------------------------ scoring hand-off
    def drain_scoring(self) -> list[NeedsScoring]:
        """Groups that became complete since the last call and wait for scores."""
        out, self._pending = self._pending, []
        return out

    @property
    def scoring_count(self) -> int:
        """Groups waiting for their scores."""
        return len(self._scoring)

    def gated(self, group_id: str) -> GatedGroup | None:
        """The gate's decisions for a released group (None: not gated, or gone)."""
        return self._gated.get(group_id)

    def take_counters(self) -> GateCounters:
        """The counts since the last call (a batch's report), and start again."""
        out, self.counters = self.counters, GateCounters()
        return out

    def _all_terminal(self, group: _Group) -> BankDecision:
        members = [(s.current, s.result, s.stale_retries) for s in group.slots
                   if s.result is not None and is_valid(s.result)]
        if not members:
            return self._complete(group)
        need = NeedsScoring(group.group_id, tuple(k for k, _, _ in members),
                            tuple(t for _, t, _ in members if t is not None),
                            tuple(r for _, _, r in members))
        self._scoring[group.group_id] = need
        self._pending.append(need)
        return None

    def on_scored(self, group_id: str, scores: GroupScores) -> list[Retry] | GroupDone | None:
        """Judge the group's members on ``scores``: re-run slots (the :class:`Retry` list),
        or complete the group. ``None``: the group no longer waits for scores."""
        need = self._scoring.pop(group_id, None)
        group = self._groups.get(group_id)
        if need is None or group is None or group.status is not GroupStatus.OPEN:
            return None
        members = [GroupMember(t, scores.logprobs.get(t.trajectory_id), r)
                   for t, r in zip(need.trajectories, need.stale_retries, strict=True)]
        judged = judge_group(self.gate, group_id, members, scores.version,
                             self.staleness.estimators)
        key_of = {k.slot: k for k in need.keys}
        retries_of = {k.slot: r for k, r in zip(need.keys, need.stale_retries, strict=True)}
        for d in judged.decision.decisions:
            self._gated_event(key_of[d.slot], d, scores, retries_of[d.slot])
        retry = [d for d in judged.decision.decisions if d.verdict is Verdict.RETRY]
        if retry:
            self.counters.groups_with_retry += 1
            return [self._rerun(group, key_of[d.slot], d) for d in retry]
        excluded = frozenset(judged.decision.excluded_slots)
        self.counters.groups += 1
        for d in judged.decision.decisions:
            self.counters.add(d)
        done = self._complete(group, excluded)
        if done.ready:
            stale = {t.trajectory_id: r for t, r in zip(need.trajectories, need.stale_retries,
                                                        strict=True)}
            self._gated[group_id] = GatedGroup(judged, scores, stale)
        return done

    def _rerun(self, group: _Group, key: AttemptKey, d: GateDecision) -> Retry:
        slot = group.slots[key.slot]
        self.counters.add(d)
        self._settle(key, AttemptState.RETRIED, self.clock.now())
        self.outbox.append(self._attempt_event(EventKind.RETRIED, key))
        slot.stale_retries += 1
        slot.current = AttemptKey(key.seq, key.slot, key.retry + 1, key.group_id)
        slot.result = None
        slot.terminal = False
        group.terminal -= 1
        return Retry(slot.current, group.task_id)

    def _gated_event(self, key: AttemptKey, d: GateDecision, scores: GroupScores,
                     stale_retries: int) -> None:
        if not self._record:
            return
        base = self._attempt_event(EventKind.GATED, key)
        tid = d.trajectory_id
        self.outbox.append(AttemptGated(
            kind=EventKind.GATED, t=base.t, attempt_id=base.attempt_id, group_id=base.group_id,
            task_id=base.task_id, slot=base.slot, retry=base.retry, seq=base.seq,
            verdict=d.verdict.value, weight=d.weight, reasons=tuple(r.value for r in d.reasons),
            rare_success=d.rare_success, k3=d.k3, ess=d.ess, geo_ratio=d.geo_ratio,
            version_lag=d.version_lag, scorer=scores.scorer, scorer_version=scores.version,
            stale_retries=stale_retries, unmeasured_why=scores.errors.get(tid, ""),
        ))

    # ------------------------------------------------------------ leaving the bank
    def _set_status(self, group: _Group, status: GroupStatus) -> None:
        super()._set_status(group, status)
        if status not in (GroupStatus.OPEN, GroupStatus.READY, GroupStatus.DELIVERED):
            self._gated.pop(group.group_id, None)  # consumed, dropped or aborted
            self._scoring.pop(group.group_id, None)
