"""The attempt ledger: every launched attempt is accounted for exactly once.

An attempt moves ``in_flight -> finished -> {consumed | retried | waste}`` or, when it is
aborted or the collection closes, ``in_flight -> waste``. ``consumed``, ``retried`` and
``waste`` are final: settling an attempt twice is an error, never a silent overwrite.
Batches cut the run into windows; each settlement is recorded in exactly one window, and an
attempt unsettled at a window's end is ``carried`` over it.

Invariants (checked by :meth:`Ledger.check`)
- ``launched == in_flight + finished + consumed + retried + waste`` at every moment.
- Every settled attempt appears in exactly one window's settlements; the windows' launch
  counts sum to the total launched.
- After :meth:`Ledger.close_all` nothing is ``in_flight`` or ``finished``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from rollbank.scheduling.batch import BatchAccounting
from rollbank.scheduling.events import WasteReason
from rollbank.scheduling.types import AttemptKey


class AttemptState(StrEnum):
    IN_FLIGHT = "in_flight"
    FINISHED = "finished"  # runner returned; waiting for its group / for a batch
    CONSUMED = "consumed"
    RETRIED = "retried"
    WASTE = "waste"


FINAL = frozenset({AttemptState.CONSUMED, AttemptState.RETRIED, AttemptState.WASTE})


class LedgerError(AssertionError):
    """The accounting invariant was broken (a bug, never an episode failure)."""


@dataclass
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


class Ledger:
    """Attempt states and per-window settlement records."""

    def __init__(self) -> None:
        self.entries: dict[AttemptKey, Entry] = {}
        self._launch_calls = 0
        self._settlements: list[tuple[int, AttemptKey]] = []  # (window, key)
        self._windows: list[_Window] = [_Window(0)]

    @property
    def window(self) -> int:
        return self._windows[-1].index

    # ------------------------------------------------------------ transitions
    def launch(self, key: AttemptKey, task_id: str, t: float) -> Entry:
        if key in self.entries:
            raise LedgerError(f"{key.attempt_id} launched twice")
        self._launch_calls += 1
        entry = Entry(key, task_id, t, window=self.window)
        self.entries[key] = entry
        self._windows[-1].launched += 1
        return entry

    def finish(
        self, key: AttemptKey, t: float, *, model_tokens: int, reward: float | None
    ) -> Entry:
        entry = self._get(key)
        if entry.state is not AttemptState.IN_FLIGHT:
            raise LedgerError(f"{key.attempt_id} finished while {entry.state.value}")
        entry.state = AttemptState.FINISHED
        entry.finished_at = t
        entry.duration_s = max(0.0, t - entry.launched_at)
        entry.model_tokens = model_tokens
        entry.reward = reward
        return entry

    def settle(
        self, key: AttemptKey, state: AttemptState, t: float, reason: WasteReason | None = None
    ) -> Entry:
        entry = self._get(key)
        if state not in FINAL:
            raise LedgerError(f"{state.value} is not a settlement")
        if entry.state in FINAL:
            raise LedgerError(f"{key.attempt_id} settled twice ({entry.state.value}, {state.value})")
        if entry.state is AttemptState.IN_FLIGHT and state is not AttemptState.WASTE:
            raise LedgerError(f"{key.attempt_id} is in flight; only waste can settle it")
        if (state is AttemptState.WASTE) != (reason is not None):
            raise LedgerError("a waste settlement needs a reason, and only waste has one")
        entry.state = state
        entry.settled_at = t
        entry.waste_reason = reason
        w = self._windows[-1]
        w.settled[state] += 1
        w.seconds[state] += entry.held_s(t)
        if reason is not None:
            w.waste_by_reason[reason.value] += 1
        self._settlements.append((w.index, key))
        return entry

    # ------------------------------------------------------------ queries
    def unsettled(self) -> list[Entry]:
        return [e for e in self.entries.values() if e.state not in FINAL]

    def counts(self) -> dict[AttemptState, int]:
        c = Counter(e.state for e in self.entries.values())
        return {s: c.get(s, 0) for s in AttemptState}

    def check(self) -> None:
        """Raise :class:`LedgerError` unless every attempt is accounted for exactly once."""
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
        if sum(w.launched for w in self._windows) != self._launch_calls:
            raise LedgerError("window launch counts do not sum to the launches")
        per_window = Counter(wi for wi, _ in self._settlements)
        for w in self._windows:
            if sum(w.settled.values()) != per_window.get(w.index, 0):
                raise LedgerError(f"window {w.index} counts disagree with its settlements")

    # ------------------------------------------------------------ windows
    def close_window(self, now: float) -> BatchAccounting:
        """End the current window (a batch boundary) and return its accounting."""
        w = self._windows[-1]
        unsettled = self.unsettled()
        counts = self.counts()
        acc = BatchAccounting(
            launched=w.launched,
            consumed=w.settled[AttemptState.CONSUMED],
            retried=w.settled[AttemptState.RETRIED],
            waste=w.settled[AttemptState.WASTE],
            carried=len(unsettled),
            carried_running=sum(1 for e in unsettled if e.state is AttemptState.IN_FLIGHT),
            waste_by_reason=dict(w.waste_by_reason),
            consumed_s=w.seconds[AttemptState.CONSUMED],
            retried_s=w.seconds[AttemptState.RETRIED],
            waste_s=w.seconds[AttemptState.WASTE],
            total_launched=len(self.entries),
            total_settled=sum(counts[s] for s in FINAL),
        )
        self._windows.append(_Window(w.index + 1))
        return acc

    def close_all(self, now: float) -> list[Entry]:
        """Settle everything still open as waste (``unconsumed_at_close``); return those."""
        closed = []
        for entry in self.unsettled():
            closed.append(self.settle(entry.key, AttemptState.WASTE, now,
                                      WasteReason.UNCONSUMED_AT_CLOSE))
        return closed

    def _get(self, key: AttemptKey) -> Entry:
        try:
            return self.entries[key]
        except KeyError:
            raise LedgerError(f"{key.attempt_id} was never launched") from None
