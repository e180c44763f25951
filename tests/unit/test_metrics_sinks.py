"""Event sinks: the JSONL log, the Prometheus endpoint and the live view."""

from __future__ import annotations

import io
import json
import urllib.request
from pathlib import Path

from rich.console import Console

from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.metrics.events import EventLog, read_events
from rollbank.metrics.live import LiveView
from rollbank.metrics.prometheus import PrometheusSink
from rollbank.scheduling.policy.events import (
    AttemptEvent,
    AttemptFinished,
    AttemptWaste,
    BatchEvent,
    Event,
    EventKind,
    GroupEvent,
    WasteReason,
)


def attempt(kind: EventKind, t: float, slot: int = 0) -> AttemptEvent:
    return AttemptEvent(kind=kind, t=t, attempt_id=f"g0/s{slot}/r0", group_id="g0",
                        task_id="task", slot=slot, retry=0, seq=0)


def finished(t: float, slot: int, reason: Reason, reward: float | None) -> AttemptFinished:
    return AttemptFinished(kind=EventKind.FINISHED, t=t, attempt_id=f"g0/s{slot}/r0",
                           group_id="g0", task_id="task", slot=slot, retry=0, seq=0,
                           outcome=EpisodeOutcome.of(reason, reward=reward), duration_s=t,
                           model_tokens=12, total_tokens=40)


def lifecycle() -> list[Event]:
    return [
        attempt(EventKind.LAUNCHED, 0.0, 0),
        attempt(EventKind.LAUNCHED, 0.0, 1),
        attempt(EventKind.STARTED, 0.1, 0),
        finished(2.0, 0, Reason.VERIFIED_PASS, 1.0),
        finished(3.0, 1, Reason.SANDBOX_DIED, None),
        AttemptWaste(kind=EventKind.WASTE, t=3.0, attempt_id="g0/s1/r0", group_id="g0",
                     task_id="task", slot=1, retry=0, seq=0, reason=WasteReason.INFRA_FINAL,
                     held_s=3.0),
        GroupEvent(kind=EventKind.GROUP_READY, t=3.0, group_id="g0", task_id="task", seq=0,
                   size=2, valid=1, zero_variance=True),
        BatchEvent(kind=EventKind.BATCH_READY, t=3.5, batch_index=0, groups=1, trajectories=1,
                   window_start=0.0),
    ]


def test_event_log_writes_every_event_in_order(tmp_path: Path) -> None:
    path = tmp_path / "run" / "events.jsonl"
    log = EventLog(path, flush_every=1000, flush_interval_s=3600)
    events = lifecycle()
    for e in events[:-1]:
        log.emit(e)
    last_launch = max(i for i, e in enumerate(events) if e.kind is EventKind.LAUNCHED)
    # buffered: only up to the last launch (launches are written through), then batch or close
    assert [r["kind"] for r in read_events(path)] == [e.kind.value for e in events[:last_launch + 1]]
    assert last_launch < len(events) - 2
    log.emit(events[-1])  # batch_ready flushes
    log.record("run_finished", 4.0, batches=1)
    log.close()
    rows = read_events(path)
    assert [r["kind"] for r in rows] == [e.kind.value for e in events] + ["collector.run_finished"]
    assert rows[3]["outcome"]["reason"] == "verified_pass"
    assert rows[5]["reason"] == "infra_final"
    assert rows[-1]["batches"] == 1 and "wall" in rows[-1]
    # a truncated last line (crash mid-write) is skipped, not fatal
    with path.open("a") as fh:
        fh.write('{"kind": "launch')
    assert len(read_events(path)) == len(rows)


def test_prometheus_counts_and_serves(tmp_path: Path) -> None:
    sink = PrometheusSink()
    for e in lifecycle():
        sink.emit(e)
    text = sink.exposition().decode()
    assert 'rollbank_outcomes_total{outcome="model_success",reason="verified_pass"} 1.0' in text
    assert 'rollbank_outcomes_total{outcome="infra_failure",reason="sandbox_died"} 1.0' in text
    assert "rollbank_attempts_in_flight 0.0" in text
    assert 'rollbank_waste_total{reason="infra_final"} 1.0' in text
    assert "rollbank_batches_total 1.0" in text
    assert "rollbank_model_tokens_total 24.0" in text
    port = sink.serve(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            body = resp.read().decode()
        assert "rollbank_time_to_batch_seconds_count 1.0" in body
    finally:
        sink.close()


def test_live_view_counts_and_renders() -> None:
    out = io.StringIO()
    view = LiveView(total_batches=2, groups_per_batch=1,
                    console=Console(file=out, force_terminal=False, width=100), min_interval_s=0)
    for e in lifecycle():
        view.emit(e)
    view.close()
    s = view.stats()
    assert s["launched"] == 2 and s["running"] == 0 and s["finished"] == 2
    assert s["outcomes"] == {"model_success": 1, "infra_failure": 1}
    assert s["batches"] == 1 and s["waste"] == 1 and s["groups_ready"] == 1
    assert "1 / 2" in out.getvalue()
    json.dumps(s)  # JSON-ready
