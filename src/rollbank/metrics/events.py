"""The JSONL event log: every lifecycle event of a collection, one JSON object per line.

:class:`EventLog` implements the scheduler's :class:`~rollbank.scheduling.events.EventSink`
(``launched``, ``started``, ``finished``, ``retried``, ``carried``, ``aborted``,
``group_ready``, ``group_dropped``, ``batch_ready``, ``waste``) and adds the collector's own
events through :meth:`EventLog.record` (``run_started``, ``servers_ready``, ``batch_written``,
``run_finished``...), whose kinds are prefixed ``collector.`` so they never collide with the
scheduler's closed vocabulary.

Invariants
- Lines are appended in emission order; each line is a complete JSON object with ``kind``
  and ``t`` (seconds on the collector clock) and, for run-level events, wall time ``wall``.
- :meth:`emit` does no I/O most of the time: lines are buffered and written on :meth:`flush`
  (at every ``batch_ready``, every ``flush_every`` lines, at most ``flush_interval_s`` after
  the oldest buffered line, and on close), so a crash loses at most a few seconds of events
  and ``tail -f`` follows a run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import IO, Any

from rollbank.scheduling.events import Event, EventKind

COLLECTOR_PREFIX = "collector."


def _json_default(o: object) -> Any:
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    return repr(o)


class EventLog:
    """Append-only JSONL event log (an :class:`EventSink`)."""

    def __init__(self, path: Path, *, flush_every: int = 256, flush_interval_s: float = 2.0
                 ) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: IO[str] | None = path.open("a", encoding="utf-8")
        self._buf: list[str] = []
        self._flush_every = flush_every
        self._flush_interval = flush_interval_s
        self._oldest: float | None = None
        self.count = 0

    def emit(self, event: Event) -> None:
        self._append(event.to_dict())
        if event.kind is EventKind.BATCH_READY:
            self.flush()

    def record(self, kind: str, t: float, **fields: Any) -> None:
        """A collector-level event (``kind`` gets the ``collector.`` prefix)."""
        self._append({"kind": COLLECTOR_PREFIX + kind, "t": t, "wall": time.time(), **fields})

    def _append(self, d: dict[str, Any]) -> None:
        self._buf.append(json.dumps(d, default=_json_default, sort_keys=True))
        self.count += 1
        now = time.monotonic()
        if self._oldest is None:
            self._oldest = now
        if len(self._buf) >= self._flush_every or now - self._oldest >= self._flush_interval:
            self.flush()

    def flush(self) -> None:
        if self._fh is None or not self._buf:
            return
        self._fh.write("\n".join(self._buf) + "\n")
        self._fh.flush()
        self._buf.clear()
        self._oldest = None

    def close(self) -> None:
        self.flush()
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every event of a log, in order (a truncated last line is skipped)."""
    out: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out
