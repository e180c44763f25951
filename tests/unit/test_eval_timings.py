"""Eval's latency percentiles come from request timings; its set-up time is measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from episode_rig import FileVerifier, fake_spec, make_task

from rollbank.collect_config import load_collect_config
from rollbank.episodes.sandboxes import WarmSource
from rollbank.episodes.sources import SandboxPlane
from rollbank.evaluation.run import eval_config, evaluate
from rollbank.evaluation.scoring import ttft_summary
from rollbank.evaluation.timing import RequestTiming
from rollbank.inference.fake import FakeTokenizer, make_fake_fleet
from rollbank.inference_plane import InferencePlane
from rollbank.sandbox.fake import FakeBackend
from rollbank.sandbox.pool import WarmPool

TOK = FakeTokenizer()


def timing(i: int, total: float, *, first: float | None = None,
           decode: float | None = None) -> RequestTiming:
    return RequestTiming(f"r{i}", "s0", total, 8, 100, first, decode)


def test_without_per_request_ttft_the_percentiles_are_requests_not_bucket_edges() -> None:
    """Regression: with vLLM's non-streamed scale-out answers (no per-request TTFT) eval took
    p95 and p99 from the engine histogram, so both read 5.0 s, a bucket edge."""
    hist = [(0.5, 10.0), (1.0, 60.0), (5.0, 100.0), (float("inf"), 100.0)]
    timings = [timing(i, 0.1 * (i + 1)) for i in range(100)]  # 0.1 .. 10.0 s
    s = ttft_summary(timings, hist)
    assert s["source"] == "client_round_trip" and s["n"] == 100
    assert s["p95"] == pytest.approx(9.5) and s["p99"] == pytest.approx(9.9)
    assert s["p95"] != s["p99"]
    assert s["engine_histogram"]["p95"] == 5.0  # kept beside, labelled as a bucket edge
    assert "bucket" in s["engine_histogram"]["estimate"]


def test_a_reported_decode_interval_is_taken_off_the_round_trip() -> None:
    timings = [timing(i, 1.0 + i, decode=1.0) for i in range(3)]
    s = ttft_summary(timings, None)
    assert s["source"] == "client_minus_engine_decode" and s["p50"] == pytest.approx(1.0)
    assert "engine_histogram" not in s


def test_server_reported_ttft_wins() -> None:
    s = ttft_summary([timing(0, 2.0, first=0.25, decode=1.0)], None)
    assert s["source"] == "server_per_request" and s["p50"] == 0.25


async def test_eval_reports_the_set_up_time_it_was_given(tmp_path: Path) -> None:
    """Regression: eval's summary said "set-up 0 s" after a 32 s start: the planes' opening
    time was not passed to the collection it runs."""
    base = load_collect_config(None, {"inference.kind": "fake", "metrics.live": "off",
                                      "metrics.report": False})
    cfg = eval_config(base, attempts=2, num_tasks=1)
    _, clients = make_fake_fleet(1, responder=lambda req: "DONE\n", decode_s_per_token=0.0)
    plane = InferencePlane({c.base_url: c for c in clients}, TOK, TOK.vocab_size, "fake")
    async with WarmPool(FakeBackend(files={"/app/.keep": b""})) as pool:
        sandboxes = SandboxPlane(WarmSource(pool, fake_spec(("L",))), FileVerifier())
        row = await evaluate(cfg, tasks=[make_task("a")], inference=plane, sandboxes=sandboxes,
                             out_dir=tmp_path / "run", ks=[1], setup_s=32.0)
    assert row["setup_s"] == 32.0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["setup_s"] == 32.0
