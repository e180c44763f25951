"""The JSONL event log: every lifecycle event of a collection, one JSON object per line.

:class:`EventLog` implements the scheduler's :class:`~rollbank.scheduling.policy.events.EventSink`
(``launched``, ``started``, ``finished``, ``retried``, ``carried``, ``aborted``,
``group_ready``, ``group_dropped``, ``batch_ready``, ``waste``) and adds the collector's own
events through :meth:`EventLog.record` (``run_started``, ``servers_ready``, ``batch_written``,
``run_finished``...), whose kinds are prefixed ``collector.`` so they never collide with the
scheduler's closed vocabulary.

Invariants
- Lines are appended in emission order; each line is a complete JSON object with ``kind``
  and ``t`` (seconds on the collector clock) and, for run-level events, wall time ``wall``.
- :meth:`emit` buffers lines and writes them on :meth:`flush` (at every ``batch_ready`` and
  ``launched``, every ``flush_every`` lines, at most ``flush_interval_s`` after the oldest
  buffered line, and on close; a write to the page cache, no fsync), so a crash loses at
  most a few seconds of events but never a launch, and ``tail -f`` follows a run.
  ``collector.batch_written`` (and the run's start and end) are written through too, and the
  collector records ``batch_written`` as soon as the batch directory is complete: after a
  SIGKILL the log and the batches on disk agree.
- Opening a log repairs it (:func:`repair_log`): a crash can leave a torn last line (bytes
  after the last newline) or a last line that is not a JSON object (e.g. zeros after a power
  loss); it is cut off, and the repair is recorded as ``collector.log_repaired`` (bytes cut,
  a prefix of the text). Every line of a repaired log parses.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from rollbank.scheduling.policy.events import Event, EventKind

COLLECTOR_PREFIX = "collector."
#: Written through at once: a batch hand-off, and every launch (so that a resumed run knows
#: every attempt the crashed one started: ``rollbank.resume``).
_FLUSH_AT = frozenset({EventKind.BATCH_READY, EventKind.LAUNCHED})
#: Collector events written through at once: a batch on disk is in the log before anything
#: else happens (``on_batch``, a trainer step, back-pressure), so a SIGKILL cannot leave a
#: complete batch directory the log does not name.
_FLUSH_RECORDS = frozenset({"batch_written", "run_started", "run_finished"})


def _json_default(o: object) -> Any:
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, set | frozenset | tuple):
        return list(o)
    return repr(o)


class EventLog:
    """Append-only JSONL event log (an :class:`EventSink`)."""

    def __init__(self, path: Path, *, flush_every: int = 256, flush_interval_s: float = 2.0,
                 now: Callable[[], float] = time.monotonic) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.repair = repair_log(path)
        self._fh: IO[str] | None = path.open("a", encoding="utf-8")
        self._buf: list[str] = []
        self._flush_every = flush_every
        self._flush_interval = flush_interval_s
        self._oldest: float | None = None
        self.count = 0
        if self.repair is not None:
            self.record("log_repaired", now(), **self.repair)
            self.flush()

    def emit(self, event: Event) -> None:
        self._append(event.to_dict())
        if event.kind in _FLUSH_AT:
            self.flush()

    def record(self, kind: str, t: float, **fields: Any) -> None:
        """A collector-level event (``kind`` gets the ``collector.`` prefix)."""
        self._append({"kind": COLLECTOR_PREFIX + kind, "t": t, "wall": time.time(), **fields})
        if kind in _FLUSH_RECORDS:
            self.flush()

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


_TAIL_CHUNK = 1 << 16


def _last_newline(fh: IO[bytes], end: int) -> int:
    """Offset just past the last ``\\n`` before ``end`` (0 if none)."""
    pos = end
    while pos > 0:
        start = max(0, pos - _TAIL_CHUNK)
        fh.seek(start)
        chunk = fh.read(pos - start)
        i = chunk.rfind(b"\n")
        if i >= 0:
            return start + i + 1
        pos = start
    return 0


def _is_event_line(raw: bytes) -> bool:
    try:
        return isinstance(json.loads(raw), dict)
    except (ValueError, UnicodeDecodeError):
        return False


def repair_log(path: Path) -> dict[str, Any] | None:
    """Cut a torn (or unparseable) last line off the log at ``path``; describe what was cut
    (``None``: the log was whole or absent). The cut is fsync'd."""
    if not path.is_file():
        return None
    with path.open("rb+") as fh:
        end = fh.seek(0, os.SEEK_END)
        keep = _last_newline(fh, end)  # bytes after the last newline: a torn line
        if keep == end and end > 0:  # the last line is complete: does it parse?
            start = _last_newline(fh, end - 1)
            fh.seek(start)
            if not _is_event_line(fh.read(end - start).strip() or b"{}"):
                keep = start
        if keep == end:
            return None
        fh.seek(keep)
        cut = fh.read(end - keep)
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    return {"path": str(path), "cut_bytes": len(cut), "kept_bytes": keep,
            "cut_prefix": cut[:80].decode("utf-8", "replace")}


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
