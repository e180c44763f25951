"""Progress for a stream that is not a terminal: plain lines, and a one-screen end summary.

:class:`PlainProgress` is an :class:`~rollbank.scheduling.policy.events.EventSink` beside the rich
:class:`~rollbank.metrics.live.LiveView`; :func:`progress_sink` picks one by ``isatty``. Lines
are short, prefixed ``[rollbank]``, flushed at once (a log file or CI console shows them as
they happen): servers ready, each group ready or dropped (``groups k/G``), a heartbeat of
finished attempts at most every ``heartbeat_s`` seconds, each batch ready and written. A batch
is named by its 0-based index everywhere (``batch 0`` is ``batches/batch-000000`` and
``batch_index`` 0 in the JSON); counts read ``k of N``.

:func:`run_summary_lines` renders the end-of-run summary from summary dicts (the same numbers
summary.json holds), so it can be re-rendered from an output folder.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, TextIO

from rollbank.scheduling.policy.events import (
    AttemptFinished,
    BatchEvent,
    Event,
    EventKind,
    EventSink,
    GroupEvent,
)

PREFIX = "[rollbank]"


class ProgressSink(EventSink, Protocol):
    """An event sink the collector closes at the end of the run."""

    def close(self) -> None: ...


class PlainProgress:
    """Plain progress lines on ``stream`` (default: stderr)."""

    def __init__(
        self,
        *,
        total_batches: int,
        groups_per_batch: int,
        stream: TextIO | None = None,
        heartbeat_s: float = 30.0,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total_batches = total_batches
        self.groups_per_batch = groups_per_batch
        self.stream = stream or sys.stderr
        self.heartbeat_s = heartbeat_s
        self._wall = wall
        self._last_beat = wall()
        self._t0: float | None = None
        self.outcomes: Counter[str] = Counter()
        self.groups_in_batch = 0
        self.batches = 0

    def line(self, text: str) -> None:
        self.stream.write(f"{PREFIX} {text}\n")
        self.stream.flush()

    def _at(self, t: float) -> str:
        return f"t={t - (self._t0 if self._t0 is not None else t):.0f}s"

    def emit(self, event: Event) -> None:
        if self._t0 is None:
            self._t0 = event.t
        if isinstance(event, AttemptFinished):
            self.outcomes[event.outcome.outcome.value] += 1
            if self._wall() - self._last_beat >= self.heartbeat_s:
                self._last_beat = self._wall()
                self.line(f"attempts finished {sum(self.outcomes.values())} ({_counts(self.outcomes)}) "
                          f"{self._at(event.t)}")
        elif isinstance(event, GroupEvent) and event.kind is EventKind.GROUP_READY and event.held:
            self.line(f"batch {self.batches}: group of {event.task_id} "
                      f"held back ({event.valid}/{event.size} valid, zero variance; dynamic "
                      f"sampling looks for groups with variance first) {self._at(event.t)}")
        elif isinstance(event, GroupEvent) and event.kind is EventKind.GROUP_READY:
            self.groups_in_batch += 1
            signal = "zero variance" if event.zero_variance else "reward variance"
            self.line(f"batch {self.batches}: groups "
                      f"{min(self.groups_in_batch, self.groups_per_batch)}/{self.groups_per_batch} "
                      f"(task {event.task_id}, {event.valid}/{event.size} valid, {signal}) {self._at(event.t)}")
        elif isinstance(event, GroupEvent) and event.kind is EventKind.GROUP_DROPPED:
            self.line(f"group of {event.task_id} dropped ({event.why or 'unusable'}) {self._at(event.t)}")
        elif isinstance(event, BatchEvent):
            self.batches += 1
            self.groups_in_batch = max(0, self.groups_in_batch - event.groups)
            self.line(f"batch {event.batch_index} ready ({self.batches} of {self.total_batches}): "
                      f"{event.groups} groups, {event.trajectories} trajectories {self._at(event.t)}")

    def server_ready(self, index: int, startup_s: float) -> None:
        self.line(f"server {index} ready in {startup_s:.0f} s")

    def batch_written(self, index: int, path: object, time_to_batch_s: float) -> None:
        self.line(f"batch {index} written to {path} (time to batch {time_to_batch_s:.0f} s)")

    def close(self) -> None:
        pass


def _counts(c: Counter[str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(c.items())) or "-"


def wants_live(mode: Literal["auto", "on", "off"], stream: TextIO | None) -> bool:
    """The rich view on a terminal (or forced), plain lines otherwise. No stream (Python's
    ``sys.stderr`` is None when started with file descriptor 2 closed) or a closed one: no view."""
    if stream is None:
        return False
    try:
        tty = stream.isatty()
    except (ValueError, OSError):  # closed
        return False
    return mode == "on" or (mode == "auto" and tty)


def progress_sink(
    mode: Literal["auto", "on", "off"], *, total_batches: int, groups_per_batch: int,
    stream: TextIO | None = None,
) -> ProgressSink | None:
    """``LiveView`` when ``wants_live``; ``PlainProgress`` for ``auto`` on a non-terminal;
    None when off or there is no stream to write to."""
    stream = stream or sys.stderr
    if mode == "off" or stream is None or getattr(stream, "closed", False):
        return None
    if wants_live(mode, stream):
        from rollbank.metrics.live import LiveView

        return LiveView(total_batches=total_batches, groups_per_batch=groups_per_batch)
    return PlainProgress(total_batches=total_batches, groups_per_batch=groups_per_batch, stream=stream)


def zero_variance_extra(groups: Sequence[Any]) -> dict[str, Any]:
    """How many of a batch's groups (``GroupResult``) carry no learning signal (all valid
    rewards equal, so every advantage is 0): the summary's ``extra`` fields."""
    zero = sum(1 for g in groups if g.zero_variance)
    return {"zero_variance_groups": zero,
            "zero_variance_share": zero / len(groups) if groups else None}


def zero_variance_share(batches: Sequence[dict[str, Any]]) -> float | None:
    """Zero-variance groups / groups over summary dicts (None without groups)."""
    groups = sum(int(b.get("n_groups", 0)) for b in batches)
    zero = sum(int((b.get("extra") or {}).get("zero_variance_groups", 0)) for b in batches)
    return zero / groups if groups else None


def _num(v: Any, fmt: str = ".0f", unit: str = "") -> str:
    return "-" if v is None else f"{v:{fmt}}{unit}"


#: what each final ledger state means, in the summary's words
_SETTLED = (("consumed", "in batches"), ("retried", "re-run in their slot"), ("waste", "wasted"))
_WASTE_WHY = {
    "unconsumed_at_close": "still running or unused when the run ended",
    "aborted": "aborted stragglers", "infra_final": "infra failures past the retry limit",
    "group_dropped": "groups with too few valid siblings",
    "zero_variance": "zero-variance groups filtered", "stale_final": "too stale (gate)",
}


def ledger_line(ledger: dict[str, Any]) -> str:
    """``attempts: 32 launched = 16 in batches + 16 wasted (16 still running or unused when the
    run ended)``: the final accounting, states that are 0 left out, waste by reason."""
    parts = [f"{int(ledger.get(k, 0))} {why}" for k, why in _SETTLED if ledger.get(k)]
    open_ = {k: int(ledger.get(k, 0)) for k in ("in_flight", "finished", "delivered")
             if ledger.get(k)}
    parts += [f"{n} {k.replace('_', ' ')}" for k, n in open_.items()]
    reasons = ledger.get("waste_by_reason") or {}
    why = ", ".join(f"{n} {_WASTE_WHY.get(r, r.replace('_', ' '))}"
                    for r, n in sorted(reasons.items()) if n)
    text = f"attempts: {int(ledger.get('launched', 0))} launched = " + (" + ".join(parts) or "0")
    return text + (f" ({why})" if why else "")


def run_summary_lines(
    batches: Sequence[dict[str, Any]], *, out_dir: object, setup_s: float, collection_s: float,
    attempts: int, ledger: dict[str, Any] | None = None, all_groups: dict[str, Any] | None = None,
    interrupted: str | None = None,
) -> list[str]:
    """The one-screen end-of-run summary (``batches``: BatchSummary.to_dict rows; ``all_groups``:
    every complete group of the run, ``HoldCounts.to_dict`` + ``dynamic_sampling``;
    ``interrupted``: why the run stopped early, e.g. ``SIGINT``)."""
    completed = all_groups
    outcomes: Counter[str] = Counter()
    groups = zero = 0
    for b in batches:
        outcomes.update(b.get("outcomes", {}))
        groups += int(b.get("n_groups", 0))
        zero += int(b.get("extra", {}).get("zero_variance_groups", 0))
    head = (f"run interrupted ({interrupted}): {len(batches)} batch(es) written"
            if interrupted else f"run finished: {len(batches)} batch(es)")
    lines = [
        f"{head} in {out_dir}",
        # with a ledger its line below says what the attempts became (one count, not two that
        # read as if they disagreed: "20 attempts" next to "20 launched = 8 in batches + ...")
        f"  set-up {setup_s:.0f} s (servers, warm pool), collection {collection_s:.0f} s"
        + ("" if ledger else f", {attempts} attempts"),
    ]
    for b in batches:
        lb = b.get("lower_bound") or {}
        eff = b.get("efficiency")
        bind = f" (bound by {lb['binding_term']})" if lb.get("binding_term") else ""
        lines.append(
            f"  batch {b.get('batch_index')}: {b.get('n_groups')} groups, "
            f"{b.get('n_trajectories')} trajectories, time to batch {_num(b.get('time_to_batch_s'))} s, "
            f"efficiency {_num(eff, '.2f')}{bind}, {_num(b.get('tokens_per_s'), '.1f')} tok/s")
    lines.append(f"  outcomes: {_counts(outcomes)}")
    if groups:
        lines.append(f"  reward variance: {groups - zero}/{groups} groups with reward variance "
                     f"({(groups - zero) / groups:.0%}); {zero} zero-variance (advantages all 0)")
    if completed and completed.get("groups_completed"):
        c, z = int(completed["groups_completed"]), int(completed["zero_variance_completed"])
        ds = (f"; dynamic sampling released {completed.get('zero_variance_released', 0)} of them "
              f"into batches, {completed.get('held_back', 0)} still held at the end"
              if completed.get("dynamic_sampling") else "")
        lines.append(f"  all complete groups: {c - z}/{c} with reward variance, {z} zero-variance "
                     f"({z / c:.0%}){ds}")
    if ledger:
        lines.append("  " + ledger_line(ledger))
    lines.append(f"  report: {out_dir}/report.html   summary: {out_dir}/summary.json")
    return lines
