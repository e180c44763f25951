"""The publish bench's summary: the in-pause breakdown and the pause counted from its answer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbank_bench.publish import from_train, summarize


def record(pause: float, pause_route: float, apply: float) -> dict[str, object]:
    return {"publication_s": pause + 1.0, "apply_pause_s": pause, "tokens_during": 3, "bytes": 10,
            "ok": True, "steps_s": {"pause_s": pause_route, "apply_s": apply, "drifted": 0.0}}


def test_summary_splits_the_wait_for_the_running_step_from_the_stop() -> None:
    s = summarize([record(0.5, 0.4, 0.05), record(0.3, 0.2, 0.07), record(0.2, 0.05, 0.1)])
    assert s["apply_pause_s"]["p50"] == 0.3
    assert abs(s["after_pause_ack_s"]["p50"] - 0.1) < 1e-9  # 0.1, 0.1, 0.15
    assert s["steps_p50_s"] == {"apply_s": 0.07, "pause_s": 0.2}  # flags (no _s) left out
    assert summarize([])["after_pause_ack_s"] == {"p50": None, "p95": None}


def _run(root: Path, pattern: str, plan: str, pauses: list[float]) -> Path:
    root.mkdir()
    lines = []
    for v, pause in enumerate(pauses, start=1):
        lines.append({"kind": "step", "version": v})
        lines.append({"kind": "publication", "version": v, "publication_s": pause + 0.5,
                      "apply_pause_s": pause, "pattern": pattern,
                      "detail": {"pattern": pattern, "plan": plan, "ok": True, "bytes": 64,
                                 "tensors": 3, "steps_s": {"apply_s": pause / 2}}})
    (root / "train.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return root


def test_the_loops_own_records_are_reported_per_pattern_side_by_side(tmp_path: Path) -> None:
    colo = _run(tmp_path / "colo", "colocated", "pause", [0.01, 0.03, 0.02])
    ckpt = _run(tmp_path / "ckpt", "checkpoint", "finish", [0.4, 0.6])
    out = from_train([colo, ckpt])
    assert sorted(out) == ["checkpoint/finish", "colocated/pause"]
    c = out["colocated/pause"]
    assert c["n"] == 3 and c["runs"] == [str(colo)] and c["source"] == "train.jsonl"
    assert c["apply_pause_s"]["p50"] == 0.02 and c["publication_s"]["p50"] == 0.52
    assert c["steps_p50_s"] == {"apply_s": 0.01} and c["bytes"] == 64 and c["failed"] == 0
    assert c["tokens_during_publication"] == {"p50": None, "p95": None}  # the loop does not count them
    assert out["checkpoint/finish"]["n"] == 2
    with pytest.raises(SystemExit, match=r"no train\.jsonl"):
        from_train([tmp_path / "nothing"])
