"""`rollbank bench routing --engine accel-sim` end to end, small: two emulated engine processes,
two rollbank arms over two rotated rounds, the per-arm time and cache fields and the timeline."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rollbank_bench.routing import _main, add_arguments, apply_defaults

pytestmark = pytest.mark.integration

PROFILE = """
source = "integration test profile (not a measurement)"
block_size = 16
kv_capacity_tokens = 65536
max_num_seqs = 64
max_num_batched_tokens = 2048
max_model_len = 4096
vocab_size = 5000
step_base_s = 0.002
decode_per_seq_s = 0.0
decode_per_ctx_token_s = 0.0
prefill_per_token_s = 0.000005
"""


async def test_bench_routing_on_accelsim_reports_time_per_rotated_round(tmp_path: Path) -> None:
    prof = tmp_path / "itest.toml"
    prof.write_text(PROFILE)
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([
        "--engine", "accel-sim", "--profile", str(prof), "--servers", "2", "--quick",
        "--repeats", "2", "--policies", "round_robin,cache_aware", "--peers", "",
        "--max-tokens", "4", "--tool-pause", "0.02", "--header-tokens", "32",
        "--task-tokens", "64", "--obs-tokens", "8,24", "--timeline", str(tmp_path / "tl.jsonl"),
    ])
    apply_defaults(args)
    report = await _main(args)
    assert report["engine"] == "accel-sim" and report["workload"]["block_size"] == 16
    arms = {a["name"]: a for a in report["arms"]}
    assert set(arms) == {"rollbank:round_robin", "rollbank:cache_aware"}
    for arm in arms.values():
        assert "error" not in arm
        assert arm["requests"] == 4 * 2 * 3  # quick: 4 groups x 2 siblings x 3 turns
        assert arm["ttft_measured"] == arm["requests"]
        assert 0 < arm["ttft_p50_s"] <= arm["ttft_p95_s"] < arm["wall_s"]
        assert arm["engine_ttft_p95_s"] is not None and arm["hit_rate"] is not None
        assert sorted(arm["rounds"]["order"]) == [0, 1]  # rotated: once first, once second
    # siblings share a prompt and turns extend it: cache-aware reuses more than round-robin
    assert arms["rollbank:cache_aware"]["hit_rate"] > arms["rollbank:round_robin"]["hit_rate"]
    lines = [json.loads(x) for x in (tmp_path / "tl.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and all(len(x["requests"]) == 24 and x["depth"] for x in lines)
    assert "target_repeated_cut_ge_90pct" in report["summary"]
