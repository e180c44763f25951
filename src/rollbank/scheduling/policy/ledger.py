"""The attempt ledger: every launched attempt is accounted for exactly once.

An attempt moves ``in_flight -> finished -> {retried | waste}``, or
``finished -> delivered -> consumed`` when its group is handed to the consumer in a batch and
the consumer acknowledges that batch (an unacknowledged batch goes back:
``delivered -> finished``), or, when it is aborted or the collection closes,
``in_flight -> waste``. ``consumed``, ``retried`` and
``waste`` are final: settling an attempt twice is an error, never a silent overwrite.
Batches cut the run into windows; each settlement is recorded in exactly one window, and an
attempt unsettled at a window's end is ``carried`` over it.

Invariants (checked by :meth:`Ledger.check`)
- ``launched == in_flight + finished + delivered + consumed + retried + waste`` at every
  moment; only a ``delivered`` attempt can become ``consumed``, and only a valid one is
  ever delivered.
- Every settled attempt appears in exactly one window's settlements; the windows' launch
  counts sum to the total launched.
- After :meth:`Ledger.close_all` nothing is ``in_flight`` or ``finished``.

:meth:`Ledger.check` is incremental by default (the unsettled attempts, the settlements
since the last check and the windows: cheap at every hand-off of a long run); ``full=True``
re-derives everything from every entry.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from rollbank.batching.batch import BatchAccounting
from rollbank.errors import SchedulingError
from rollbank.scheduling.policy.events import WasteReason
from rollbank.scheduling.policy.pool import Pool
from rollbank.scheduling.policy.types import AttemptKey


class AttemptState(StrEnum):
    IN_FLIGHT = "in_flight"
    FINISHED = "finished"  # runner returned; waiting for its group / for a batch
    DELIVERED = "delivered"  # in a batch handed to the consumer, awaiting its acknowledgement
    CONSUMED = "consumed"
    RETRIED = "retried"
    WASTE = "waste"


FINAL = frozenset({AttemptState.CONSUMED, AttemptState.RETRIED, AttemptState.WASTE})


class LedgerError(SchedulingError):
    """The accounting invariant was broken (a bug, never an episode failure); stops the run."""


@dataclass(slots=True)
class Entry:
    key: AttemptKey
    task_id: str
    launched_at: float
    state: AttemptState = AttemptState.IN_FLIGHT
    finished_at: float | None = None
    settled_at: float | None = None
    waste_reason: WasteReason | None = None
    window: int = 0  # window in which it was launched
    duration_s: float | None = None
    model_tokens: int | None = None
    reward: float | None = None  # reward of a valid (trainable) finish, else None
    valid: bool = False  # finished as model_success/model_failure (trainable)
    delivered_in: int | None = None  # window of its latest delivery

    def held_s(self, now: float) -> float:
        end = self.finished_at if self.finished_at is not None else self.settled_at
        end = now if end is None else end
        return max(0.0, end - self.launched_at)


@dataclass
class _Window:
    index: int
    launched: int = 0
    settled: Counter[AttemptState] = field(default_factory=Counter)
    seconds: dict[AttemptState, float] = field(default_factory=lambda: dict.fromkeys(AttemptState, 0.0))
    waste_by_reason: Counter[str] = field(default_factory=Counter)
    delivered: int = 0  # attempts handed to the consumer in this window's batch
    delivered_s: float = 0.0


class Ledger:
    """Attempt states and per-window settlement records."""

    def __init__(self) -> None:
        self.entries: dict[AttemptKey, Entry] = {}
        self._launch_calls = 0
        self._settlements: list[tuple[int, AttemptKey]] = []  # (window, key)
        self._unsettled: dict[AttemptKey, Entry] = {}  # in launch order
        self._settled: set[AttemptKey] = set()
        self._checked = 0  # settlements verified by the last check
        self._per_window: Counter[int] = Counter()  # settlements per window
        self.pool = Pool()  # the selection profile's launched pool (valid finished, aborted)
        self._windows: list[_Window] = [_Window(0)]

    @property
    def window(self) -> int:
        return self._windows[-1].index

    # ------------------------------------------------------------ transitions
    def launch(self, key: AttemptKey, task_id: str, t: float) -> Entry:
        entries = self.entries
        if key in entries:
            raise LedgerError(f"{key.attempt_id} launched twice")
        self._launch_calls += 1
        w = self._windows[-1]
        entry = Entry(key, task_id, t, window=w.index)
        entries[key] = entry
        self._unsettled[key] = entry
        w.launched += 1
        return entry

    def finish(
        self, key: AttemptKey, t: float, *, model_tokens: int, reward: float | None,
        valid: bool = False,
    ) -> Entry:
        entry = self.entries.get(key)
        if entry is None:
            raise LedgerError(f"{key.attempt_id} was never launched")
        if entry.state is not AttemptState.IN_FLIGHT:
            raise LedgerError(f"{key.attempt_id} finished while {entry.state.value}")
        entry.state = AttemptState.FINISHED
        entry.finished_at = t
        duration = entry.duration_s = max(0.0, t - entry.launched_at)
        entry.model_tokens = model_tokens
        entry.reward = reward
        entry.valid = valid
        if valid:
            self.pool.add_finished(duration, model_tokens, reward)
        return entry

    def deliver(self, key: AttemptKey, t: float) -> Entry:
        """A valid finished attempt leaves in a batch; consumed once the batch is acknowledged."""
        entry = self._get(key)
        if entry.state is not AttemptState.FINISHED or not entry.valid:
            raise LedgerError(f"{key.attempt_id} delivered while {entry.state.value}"
                              + ("" if entry.valid else " and not valid"))
        entry.state = AttemptState.DELIVERED
        entry.delivered_in = self.window
        w = self._windows[-1]
        w.delivered += 1
        w.delivered_s += entry.held_s(t)
        return entry

    def undeliver(self, key: AttemptKey) -> Entry:
        """The batch holding this attempt was not acknowledged: it is back in the bank."""
        entry = self._get(key)
        if entry.state is not AttemptState.DELIVERED:
            raise LedgerError(f"{key.attempt_id} returned while {entry.state.value}")
        entry.state = AttemptState.FINISHED
        return entry

    def settle(
        self, key: AttemptKey, state: AttemptState, t: float, reason: WasteReason | None = None
    ) -> Entry:
        entry = self.entries.get(key)
        if entry is None:
            raise LedgerError(f"{key.attempt_id} was never launched")
        prev = entry.state
        if state not in FINAL:
            raise LedgerError(f"{state.value} is not a settlement")
        if prev in FINAL:
            raise LedgerError(f"{key.attempt_id} settled twice ({prev.value}, {state.value})")
        if prev is AttemptState.IN_FLIGHT and state is not AttemptState.WASTE:
            raise LedgerError(f"{key.attempt_id} is in flight; only waste can settle it")
        if (state is AttemptState.CONSUMED) != (prev is AttemptState.DELIVERED):
            raise LedgerError(f"{key.attempt_id}: only a delivered attempt is consumed "
                              f"({prev.value} -> {state.value})")
        if (state is AttemptState.WASTE) != (reason is not None):
            raise LedgerError("a waste settlement needs a reason, and only waste has one")
        settled = self._settled
        if key in settled:
            raise LedgerError(f"{key.attempt_id} settled twice")
        entry.state = state
        entry.settled_at = t
        entry.waste_reason = reason
        settled.add(key)
        self._unsettled.pop(key, None)
        # held_s(t): launch to finish, or to ``t`` (its settlement) if it never finished
        end = entry.finished_at
        held = max(0.0, (t if end is None else end) - entry.launched_at)
        if reason is WasteReason.ABORTED and end is None:
            self.pool.add_aborted(held)
        w = self._windows[-1]
        self._per_window[w.index] += 1
        w.settled[state] += 1
        w.seconds[state] += held
        if reason is not None:
            w.waste_by_reason[reason.value] += 1
        self._settlements.append((w.index, key))
        return entry

    # ------------------------------------------------------------ queries
    def unsettled(self) -> list[Entry]:
        return list(self._unsettled.values())

    def in_flight(self) -> list[Entry]:
        return [e for e in self._unsettled.values() if e.state is AttemptState.IN_FLIGHT]

    def counts(self) -> dict[AttemptState, int]:
        c = Counter(e.state for e in self.entries.values())
        return {s: c.get(s, 0) for s in AttemptState}

    def check(self, *, full: bool = False) -> None:
        """Raise :class:`LedgerError` unless every attempt is accounted for exactly once
        (incrementally; ``full``: from every entry)."""
        if full:
            self._check_full()
            return
        if not (self._launch_calls == len(self.entries)
                == len(self._unsettled) + len(self._settled)
                and len(self._settled) == len(self._settlements)):
            raise LedgerError(f"launched {self._launch_calls}, {len(self._unsettled)} "
                              f"unsettled, {len(self._settled)} settled")
        for e in self._unsettled.values():
            if e.state in FINAL:
                raise LedgerError(f"{e.key.attempt_id} is {e.state.value} without a settlement")
            if e.state is AttemptState.DELIVERED and not e.valid:
                raise LedgerError(f"invalid attempts delivered to the consumer: {e.key.attempt_id}")
        for _, key in self._settlements[self._checked:]:
            e = self.entries[key]
            if e.state not in FINAL:
                raise LedgerError("settlement records disagree with attempt states")
            if e.state is AttemptState.CONSUMED and not e.valid:
                raise LedgerError(f"invalid attempts delivered to the consumer: {key.attempt_id}")
        self._checked = len(self._settlements)
        self._check_windows(self._per_window)

    def _check_windows(self, per_window: Counter[int]) -> None:
        if sum(w.launched for w in self._windows) != self._launch_calls:
            raise LedgerError("window launch counts do not sum to the launches")
        for w in self._windows:
            if sum(w.settled.values()) != per_window.get(w.index, 0):
                raise LedgerError(f"window {w.index} counts disagree with its settlements")

    def _check_full(self) -> None:
        counts = self.counts()
        if self._launch_calls != len(self.entries) or sum(counts.values()) != len(self.entries):
            raise LedgerError(f"launched {self._launch_calls} but ledger holds {counts}")
        seen: set[AttemptKey] = set()
        for _, key in self._settlements:
            if key in seen:
                raise LedgerError(f"{key.attempt_id} settled in two windows")
            seen.add(key)
        settled = {k for k, e in self.entries.items() if e.state in FINAL}
        if seen != settled:
            raise LedgerError("settlement records disagree with attempt states")
        bad = [k.attempt_id for k, e in self.entries.items()
               if e.state in (AttemptState.DELIVERED, AttemptState.CONSUMED) and not e.valid]
        if bad:
            raise LedgerError(f"invalid attempts delivered to the consumer: {bad}")
        self._check_windows(Counter(wi for wi, _ in self._settlements))

    # ------------------------------------------------------------ windows
    def close_window(self, now: float) -> BatchAccounting:
        """End the current window (a batch boundary) and return its accounting.

        ``consumed`` counts the attempts delivered in this window's batch (settled
        ``consumed`` when the consumer acknowledges it); ``unacknowledged`` counts attempts of
        earlier batches still awaiting acknowledgement.
        """
        w = self._windows[-1]
        open_entries = self._unsettled.values()
        pending = [e for e in open_entries
                   if e.state is AttemptState.DELIVERED and e.delivered_in != w.index]
        unsettled = [e for e in open_entries if e.state is not AttemptState.DELIVERED]
        acc = BatchAccounting(
            launched=w.launched,
            consumed=w.delivered,
            retried=w.settled[AttemptState.RETRIED],
            waste=w.settled[AttemptState.WASTE],
            carried=len(unsettled),
            carried_running=sum(1 for e in unsettled if e.state is AttemptState.IN_FLIGHT),
            waste_by_reason=dict(w.waste_by_reason),
            consumed_s=w.delivered_s,
            retried_s=w.seconds[AttemptState.RETRIED],
            waste_s=w.seconds[AttemptState.WASTE],
            total_launched=len(self.entries),
            total_settled=len(self._settled),
            unacknowledged=len(pending),
            acknowledged=w.settled[AttemptState.CONSUMED],
        )
        self._windows.append(_Window(w.index + 1))
        return acc

    def close_all(self, now: float) -> list[Entry]:
        """Settle everything still open as waste (``unconsumed_at_close``); return those."""
        closed = []
        for entry in self.unsettled():
            if entry.state is AttemptState.DELIVERED:
                self.undeliver(entry.key)
            closed.append(self.settle(entry.key, AttemptState.WASTE, now,
                                      WasteReason.UNCONSUMED_AT_CLOSE))
        return closed

    def _get(self, key: AttemptKey) -> Entry:
        try:
            return self.entries[key]
        except KeyError:
            raise LedgerError(f"{key.attempt_id} was never launched") from None
