"""accelsim fidelity tooling: offline virtual-time simulation and the profile-scale fit."""

from __future__ import annotations

import pytest

from rollbank_bench.accelsim.core import EngineCore
from rollbank_bench.accelsim.profile import load_profile
from rollbank_bench.accelsim_fidelity import compare, fit_scales, make_trace, scaled, simulated


def test_simulated_trace_matches_hand_stepping_of_one_request() -> None:
    prof = load_profile("cpu-tiny-vllm032")
    trace = make_trace(groups=1, group_size=1, waves=1, wave_gap_s=0.0, seed=3)
    (row,) = simulated(prof, trace)
    q = trace[0].request
    # one request alone: a prefill step, then max_tokens - 1 decode steps
    plen, n = len(q.prompt_token_ids), q.sampling.max_tokens
    ttft = prof.step_time(prefill_tokens=plen, prefill_seqs=1, prefill_pairs=plen * (plen + 1) / 2)
    decode = sum(prof.step_time(decode_seqs=1, decode_ctx_tokens=plen + k) for k in range(1, n))
    assert row["ttft_s"] == pytest.approx(ttft)
    assert row["total_s"] == pytest.approx(ttft + decode)
    assert row["tokens"] == n and row["cached"] == 0


def test_siblings_share_the_prefix_in_simulation() -> None:
    prof = load_profile("cpu-tiny-vllm032")
    rows = simulated(prof, make_trace(groups=2, group_size=3, waves=1, wave_gap_s=0.0, seed=1))
    assert sum(r["cached"] > 0 for r in rows) >= 2  # later siblings hit the first one's blocks


def test_fit_recovers_known_scales() -> None:
    base = load_profile("cpu-tiny-vllm032")
    trace = make_trace(groups=4, group_size=2, waves=2, wave_gap_s=0.5, seed=5)
    truth = {"base": 2.0, "decode": 1.0, "prefill": 0.5}  # on the fit's grid
    measured = simulated(scaled(base, truth), trace)
    fit = fit_scales(base, trace, measured, rounds=2)
    c = fit["fit_on_calibration_trace"]
    assert abs(c["ttft_s"]["median_error"]) < 0.05 and abs(c["total_s"]["median_error"]) < 0.05
    assert fit["scales"]["base"] == pytest.approx(2.0, rel=0.2)


def test_compare_reports_relative_errors() -> None:
    real = [{"id": "a", "ttft_s": 1.0, "total_s": 2.0, "prompt": 10, "cached": 5}]
    emu = [{"id": "a", "ttft_s": 1.1, "total_s": 1.0, "prompt": 10, "cached": 0}]
    c = compare(real, emu)
    assert c["ttft_s"]["median_error"] == pytest.approx(0.1) and c["total_s"]["median_error"] == -0.5
    assert (c["real_cache_hit_rate"], c["emulated_cache_hit_rate"]) == (0.5, 0.0)
    assert c["within_15pct"] is False


def test_core_is_fresh_per_simulation() -> None:
    prof = load_profile("cpu-tiny-vllm032")
    trace = make_trace(groups=1, group_size=2, waves=1, wave_gap_s=0.0, seed=2)
    assert simulated(prof, trace) == simulated(prof, trace)  # no cache carried between runs
    assert EngineCore(prof).idle


def test_collect_accel_sim_arms_use_the_engines_as_external_servers() -> None:
    import argparse

    from rollbank_bench.collect import add_arguments, arm_config

    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args(["--engine", "accel-sim"])
    args.engine_urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    cfg = arm_config(args, "optimized")
    assert cfg.inference.kind == "external" and cfg.inference.urls == args.engine_urls
    assert cfg.inference.tokenizer == "tiny"
    assert arm_config(p.parse_args([]), "optimized").inference.kind == "managed"


def test_per_request_median_takes_each_requests_median_over_passes() -> None:
    from rollbank_bench.accelsim_fidelity import per_request_median

    def row(rid: str, ttft: float | None, total: float) -> dict[str, object]:
        return {"id": rid, "ttft_s": ttft, "total_s": total, "prompt": 8, "cached": 0}

    passes = [[row("a", 1.0, 10.0), row("b", None, 4.0)],
              [row("a", 3.0, 30.0), row("b", 2.0, 6.0)],
              [row("b", 5.0, 5.0), row("a", 2.0, 11.0)]]
    got = {r["id"]: r for r in per_request_median(passes)}
    assert (got["a"]["ttft_s"], got["a"]["total_s"]) == (2.0, 11.0)
    assert (got["b"]["ttft_s"], got["b"]["total_s"]) == (3.5, 5.0)  # None is not a pass's value
    assert got["a"]["prompt"] == 8
