"""Lifecycle events of a collection, and the sink protocol subscribers implement.

The driver calls :meth:`EventSink.emit` synchronously, in order, for every lifecycle event;
a sink must not block (buffer and flush elsewhere if it writes files). Every event has a
``kind`` from the closed vocabulary :class:`EventKind`, the collector clock time ``t`` and a
JSON-ready :meth:`Event.to_dict`.

Invariants
- Each launched attempt gets exactly one ``launched`` event and, eventually, exactly one
  ``finished`` (runner returned) or ``aborted`` event; then exactly one settlement:
  ``consumed`` (inside ``batch_acked``: the consumer acknowledged the batch that delivered
  it), ``retried``, or ``waste``. ``batch_ready`` lists the attempts it delivers;
  ``batch_returned`` lists those of an unacknowledged batch put back in the bank. ``carried`` may appear
  for it at each batch boundary it crosses unsettled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from rollbank.episodes.outcome import EpisodeOutcome


class EventKind(StrEnum):
    LAUNCHED = "launched"  # attempt got a sandbox slot and its task was started
    STARTED = "started"  # the runner reported its sandbox ready
    FINISHED = "finished"  # the runner returned a trajectory (any outcome)
    RETRIED = "retried"  # an infra/unknown attempt will be re-run in its sibling slot
    CARRIED = "carried"  # an unsettled attempt crossed a batch boundary into the next batch
    ABORTED = "aborted"  # an in-flight attempt was cancelled
    GROUP_READY = "group_ready"  # every sibling terminal; the group entered the bank
    GROUP_DROPPED = "group_dropped"  # complete but unusable (too few valid / zero variance)
    BATCH_READY = "batch_ready"  # a batch was assembled and handed out (delivered)
    BATCH_ACKED = "batch_acked"  # the consumer acknowledged a batch: its attempts are consumed
    BATCH_RETURNED = "batch_returned"  # an unacknowledged batch's groups went back to the bank
    TASK_UNREACHABLE = "task_unreachable"  # aborted and re-queued max_requeues times: given up
    WASTE = "waste"  # an attempt settled as waste (see WasteReason)
    GATED = "gated"  # the staleness gate judged a valid attempt (scheduling/policy/gating.py)
    CAPACITY = "capacity"  # the sandbox slots changed (cluster nodes joined or left)
    SERVERS = "servers"  # the inference servers serving changed (a managed server joined)


class WasteReason(StrEnum):
    ABORTED = "aborted"  # cancelled by the straggler policy
    INFRA_FINAL = "infra_final"  # infra/unknown after the retry limit (kept out of the batch)
    GROUP_DROPPED = "group_dropped"  # its group had fewer than min_valid valid siblings
    ZERO_VARIANCE = "zero_variance"  # its group was filtered for zero reward variance
    UNCONSUMED_AT_CLOSE = "unconsumed_at_close"  # still pending when the collection closed
    STALE_FINAL = "stale_final"  # dropped by the staleness gate after max_stale_retries


@dataclass(frozen=True, kw_only=True)
class Event:
    kind: EventKind
    t: float

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["kind"] = self.kind.value
        for k, v in list(d.items()):
            if isinstance(v, StrEnum):
                d[k] = v.value
        return d


@dataclass(frozen=True, kw_only=True)
class AttemptEvent(Event):
    """An event about one attempt. ``attempt_id`` is ``group_id/s<slot>/r<retry>``."""

    attempt_id: str
    group_id: str
    task_id: str
    slot: int
    retry: int
    seq: int


@dataclass(frozen=True, kw_only=True)
class AttemptFinished(AttemptEvent):
    """The runner returned. ``outcome`` is the episode verdict; timings are in seconds."""

    outcome: EpisodeOutcome
    duration_s: float
    model_tokens: int
    total_tokens: int
    servers: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["outcome"] = self.outcome.to_dict()
        return d


@dataclass(frozen=True, kw_only=True)
class AttemptWaste(AttemptEvent):
    """The attempt settled as waste; ``held_s`` is how long it held a sandbox slot."""

    reason: WasteReason
    held_s: float


@dataclass(frozen=True, kw_only=True)
class AttemptCarried(AttemptEvent):
    """Unsettled at the boundary of batch ``batch_index``; ``running`` if still in flight."""

    batch_index: int
    running: bool


@dataclass(frozen=True, kw_only=True)
class GroupEvent(Event):
    """``group_ready`` / ``group_dropped``: ``valid`` trainable siblings out of ``size``;
    ``held``: a ready zero-variance group the bank holds back (dynamic sampling)."""

    group_id: str
    task_id: str
    seq: int
    size: int
    valid: int
    zero_variance: bool
    why: str = ""
    held: bool = False  # dynamic sampling: zero variance, held back until groups with variance go


@dataclass(frozen=True, kw_only=True)
class BatchEvent(Event):
    """``batch_ready``: summary numbers of the batch; the full object is the Batch itself."""

    batch_index: int
    groups: int
    trajectories: int
    window_start: float
    accounting: dict[str, int] = field(default_factory=dict)
    delivered: tuple[str, ...] = ()  # attempt ids in this batch (consumed once acknowledged)


@dataclass(frozen=True, kw_only=True)
class BatchHandoff(Event):
    """``batch_acked`` (``attempt_ids`` settled consumed) or ``batch_returned`` (back in the
    bank, offered again)."""

    batch_index: int
    attempt_ids: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class TaskUnreachable(Event):
    """A task aborted and re-queued ``requeues`` times without finishing within the batch
    budget; its longest aborted attempt had run ``longest_elapsed_s``."""

    task_id: str
    group_id: str
    seq: int
    requeues: int
    longest_elapsed_s: float


@dataclass(frozen=True, kw_only=True)
class CapacityChanged(Event):
    """The sandbox slots the scheduler launches into are now ``sandbox_slots``."""

    sandbox_slots: int


@dataclass(frozen=True, kw_only=True)
class ServersChanged(Event):
    """The inference servers attempts may use are now ``servers`` (per-server slots each)."""

    servers: tuple[str, ...]


class EventSink(Protocol):
    """Receives every lifecycle event. Called synchronously by the driver; must not block."""

    def emit(self, event: Event) -> None: ...


class ListSink:
    """Keeps every event in memory (tests, small runs)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def emit(self, event: Event) -> None:
        self.events.append(event)

    def of(self, kind: EventKind) -> list[Event]:
        return [e for e in self.events if e.kind is kind]


class FanoutSink:
    """Forwards each event to several sinks, in order."""

    def __init__(self, *sinks: EventSink) -> None:
        self.sinks = sinks

    def emit(self, event: Event) -> None:
        for sink in self.sinks:
            sink.emit(event)


class DiscardOutbox(list[Event]):
    """An outbox that keeps nothing (long simulations that do not read events)."""

    def append(self, event: Event) -> None:
        return None

    def extend(self, events: Iterable[Event]) -> None:
        return None
