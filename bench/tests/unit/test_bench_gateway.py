"""``rollbank bench gateway --fake``: one short run, the JSON's shape (no timing asserted)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rollbank_bench import gateway


def test_fake_run_reports_both_arms_the_hop_and_the_host_load(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    gateway.add_arguments(parser)
    out = tmp_path / "g.json"
    args = parser.parse_args(["--fake", "--pairs", "4", "--agents", "3", "--turns", "2",
                              "--out", str(out)])
    assert gateway.run(args) == 0
    data = json.loads(out.read_text())
    assert data == json.loads(capsys.readouterr().out)
    assert data["engine"] == "fake" and data["cpus"] >= 1
    assert len(data["host_load_start"]) == len(data["host_load_end"]) == 3
    for arm in ("completions", "chat"):
        assert set(data[arm]) == {"direct", "engine_client", "gateway", "added",
                                  "added_vs_engine_client", "gateway_inside", "http_hop",
                                  "gateway_own"}
        assert all(data[arm][k]["n"] == 4 for k in data[arm])
        assert data[arm]["engine_client"]["p50_ms"] > 0
        assert data[arm]["http_hop"]["p50_ms"] > 0  # the wall time includes the record's total
    assert data["met"] == (data["completions"]["added"]["p50_ms"] <= 2.0)
    lo, hi = data["completions"]["added"]["p50_ci95_ms"]
    assert lo <= data["completions"]["added"]["p50_ms"] <= hi
    assert data["direct_arm"].startswith("engine client")
    assert data["throughput"]["requests"] == 6
    assert data["throughput"]["gateway"]["completion_tokens_per_s"] > 0
