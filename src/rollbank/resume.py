"""Resuming a crashed collection: ``rollbank collect --resume RUN_DIR``.

A run folder (``collector.py``) holds ``config.resolved.json``, ``batches/`` and
``events.jsonl``. :func:`prepare_resume` reads them and says how to continue:

- the configuration is the resolved one of the crashed run (no other flag applies);
- ``batches/`` is the truth for what a trainer has: complete ``batch-NNNNNN`` directories
  (``batching/writer.py``: a batch is whole or absent) must be ``0..n-1``; they are never
  rewritten, the next batch index is ``n`` and the run collects ``num_batches - n`` more;
  leftovers of a writer killed mid-batch are removed;
- the crashed segment of ``events.jsonl`` (from its last ``collector.run_started`` or
  ``collector.resumed``: a resume killed before it launched anything is a segment) says
  which attempts were launched (launches are written through: ``metrics/events.py``).
  Each is accounted exactly once in the resume record: in a written batch, settled
  (finished or aborted) but in no written batch (lost with the crash), or in flight at the
  crash -- an ``infra_failure`` (``host_error``, detail ``collector_crashed``) of the
  crashed run;
- new groups continue the group sequence after the highest one seen (fresh group ids and
  seeds; no attempt id of the crashed run is reused), so the task rotation continues and a
  lost group's task gets its turn again.

The record is logged (flushed) as ``collector.resumed`` plus one ``collector.crashed_attempt``
event per in-flight attempt -- the log is the source of truth -- then appended to
``resume.json`` (a list, one entry per resume; a kill between the two leaves the log entry
without its copy there).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbank.batching.loader import read_batch_dir
from rollbank.batching.writer import clean_leftovers, ready_batches
from rollbank.collect_config import CollectConfig
from rollbank.errors import InputError
from rollbank.metrics.events import EventLog, read_events, repair_log

RESOLVED_NAME = "config.resolved.json"
RECORD_NAME = "resume.json"
CRASH_OUTCOME = {"outcome": "infra_failure", "reason": "host_error", "detail": "collector_crashed"}
_SEQ = re.compile(r"^g(\d+)")
#: A segment of the log (one process's run) starts at either (a resume logs both).
_SEGMENT_START = frozenset({"collector.run_started", "collector.resumed"})


@dataclass
class ResumePlan:
    """How to continue a crashed run (see the module docstring)."""

    run_dir: Path
    config: CollectConfig
    written: list[int]
    next_seq: int
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def next_index(self) -> int:
        return len(self.written)

    @property
    def remaining(self) -> int:
        return max(0, self.config.scheduler.num_batches - self.next_index)


def _seq_of(group_id: str) -> int:
    m = _SEQ.match(group_id)
    return int(m.group(1)) if m else -1


def load_resolved(run_dir: Path) -> CollectConfig:
    path = run_dir / RESOLVED_NAME
    try:
        return CollectConfig.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot resume: unreadable {RESOLVED_NAME}: {exc}", file=path,
                         field="resume") from exc


def _written(batches: Path) -> tuple[list[int], set[str], set[str]]:
    """Indices of complete batches, their attempt ids and group ids."""
    indices: list[int] = []
    attempts: set[str] = set()
    groups: set[str] = set()
    for p in ready_batches(batches):
        table = read_batch_dir(p)
        indices.append(int(p.name.removeprefix("batch-")))
        attempts.update(str(a) for a in table.column("trajectory_id").to_pylist())
        groups.update(str(g) for g in table.column("group_id").to_pylist())
    if indices != list(range(len(indices))):
        raise InputError(f"cannot resume: batch indices {indices} are not 0..{len(indices) - 1}",
                         file=batches, field="resume")
    return indices, attempts, groups


def _crashed_segment(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    starts = [i for i, e in enumerate(events) if e.get("kind") in _SEGMENT_START]
    return events[starts[-1]:] if starts else events


def prepare_resume(run_dir: Path) -> ResumePlan:
    """Read a crashed run folder; clean writer leftovers; plan the continuation."""
    if not run_dir.is_dir():
        raise InputError("cannot resume: no such run folder", file=run_dir, field="resume")
    config = load_resolved(run_dir)
    batches = run_dir / "batches"
    removed = clean_leftovers(batches)
    written, in_batches, batch_groups = _written(batches)
    log_path = run_dir / "events.jsonl"
    repaired = repair_log(log_path)
    all_events = read_events(log_path) if log_path.is_file() else []
    segment = _crashed_segment(all_events)
    launched: dict[str, dict[str, Any]] = {}
    settled: set[str] = set()
    for e in segment:
        if e.get("kind") == "launched":
            launched[str(e["attempt_id"])] = e
        elif e.get("kind") in ("finished", "aborted"):
            settled.add(str(e["attempt_id"]))
    in_flight = sorted(a for a in launched if a not in settled and a not in in_batches)
    batched = sorted(a for a in launched if a in in_batches)
    lost = sorted(a for a in launched if a in settled and a not in in_batches)
    seqs = [int(e["seq"]) for e in all_events if e.get("kind") == "launched"]
    seqs += [_seq_of(g) for g in batch_groups]
    next_seq = max(seqs, default=-1) + 1
    record = {
        "wall": time.time(),
        "batches_written": written,
        "next_batch_index": len(written),
        "remaining_batches": max(0, config.scheduler.num_batches - len(written)),
        "next_seq": next_seq,
        "leftovers_removed": removed,
        "log_repaired": repaired,
        "crashed_run": {
            "launched": len(launched),
            "in_written_batches": len(batched),
            "settled_not_batched": lost,
            "in_flight": [{"attempt_id": a, "task_id": launched[a].get("task_id"), **CRASH_OUTCOME}
                          for a in in_flight],
        },
    }
    return ResumePlan(run_dir, config, written, next_seq, record)


def write_record(plan: ResumePlan, log: EventLog, t: float) -> Path:
    """Log the plan's record, then append it to ``resume.json`` (atomically)."""
    crashed = plan.record["crashed_run"]
    log.record("resumed", t, next_batch_index=plan.next_index, next_seq=plan.next_seq,
               remaining_batches=plan.remaining, batches_written=plan.written,
               launched=crashed["launched"], in_flight=len(crashed["in_flight"]))
    for a in crashed["in_flight"]:
        log.record("crashed_attempt", t, **a)
    log.flush()
    path = plan.run_dir / RECORD_NAME
    records: list[Any] = json.loads(path.read_text()) if path.is_file() else []
    records.append(plan.record)
    tmp = path.with_name(f".{RECORD_NAME}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(records, indent=2, sort_keys=True, default=str) + "\n")
    with tmp.open("rb") as fh:
        os.fsync(fh.fileno())
    tmp.replace(path)
    return path
