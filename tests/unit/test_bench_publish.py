"""The publish bench's summary: the in-pause breakdown and the pause counted from its answer."""

from __future__ import annotations

from rollbank.bench.publish import summarize


def record(pause: float, pause_route: float, apply: float) -> dict[str, object]:
    return {"publication_s": pause + 1.0, "apply_pause_s": pause, "tokens_during": 3, "bytes": 10,
            "ok": True, "steps_s": {"pause_s": pause_route, "apply_s": apply, "drifted": 0.0}}


def test_summary_splits_the_wait_for_the_running_step_from_the_stop() -> None:
    s = summarize([record(0.5, 0.4, 0.05), record(0.3, 0.2, 0.07), record(0.2, 0.05, 0.1)])
    assert s["apply_pause_s"]["p50"] == 0.3
    assert abs(s["after_pause_ack_s"]["p50"] - 0.1) < 1e-9  # 0.1, 0.1, 0.15
    assert s["steps_p50_s"] == {"apply_s": 0.07, "pause_s": 0.2}  # flags (no _s) left out
    assert summarize([])["after_pause_ack_s"] == {"p50": None, "p95": None}
