"""Agent-shaped trace profiles (an instrument) and the accel-sim engine's token/time scales."""

from __future__ import annotations

import math
import statistics

import pytest

from rollbank.episodes.workload import TraceWorkload, WorkloadConfig
from rollbank.errors import UsageError
from rollbank_bench.accelsim.core import EngineCore
from rollbank_bench.accelsim.profile import LatencyProfile, with_overrides
from rollbank_bench.traces import TRACES, Lognormal, get_trace


def prof(**kw: object) -> LatencyProfile:
    base: dict[str, object] = dict(
        name="t", source="test", block_size=4, kv_capacity_tokens=640, max_model_len=256,
        step_base_s=0.01, decode_per_seq_s=0.001, decode_per_ctx_token_s=0.0001,
        prefill_per_token_s=0.0002, prefill_per_seq_s=0.003, prefill_per_pair_s=1e-6)
    base.update(kw)
    return LatencyProfile.model_validate(base)


def test_summed_lognormal_keeps_the_mean_and_narrows() -> None:
    one = Lognormal(300.0, 0.9, 16.0, 4096.0)
    four = one.summed(4)
    assert math.isclose(four.mean, 4 * one.mean, rel_tol=1e-9)
    assert four.sigma < one.sigma and (four.lo, four.hi) == (64.0, 16384.0)
    assert one.summed(1) == one and one.scaled(0.5).median == 150.0


def test_every_profile_resolves_to_a_valid_workload_at_its_scales() -> None:
    for trace in TRACES.values():
        w = WorkloadConfig.model_validate(trace.workload_fields())
        assert w.kind == "trace" and w.max_turns == trace.max_turns // trace.turn_scale
        assert trace.describe()["label"].startswith("benchmark instrument")
    t = get_trace("tb2-reasoning")
    assert t.max_model_len == 131_072 // 16
    plans = TraceWorkload(WorkloadConfig.model_validate(t.workload_fields()))
    turns = [len(plans.plan(f"task{i % 8}", i).turns) for i in range(400)]
    # one scripted turn = 4 agent turns: the modelled median of 20 turns is ~5 scripted ones
    assert 3.5 <= statistics.median(turns) <= 7 and max(turns) <= 50
    finer = t.with_scales(turn_scale=1, time_scale=1.0)
    f = finer.workload_fields()
    assert f["turns_median"] == 20.0 and f["tool_latency_median_s"] == 1.5
    assert f["tokens_median"] == pytest.approx(300 / 16, abs=0.01)
    with pytest.raises(UsageError, match="tb2-reasoning"):
        get_trace("nope")


def test_unit_scales_leave_the_step_time_exact() -> None:
    p = prof()
    kw = dict(prefill_tokens=10, prefill_seqs=1, decode_seqs=2, decode_ctx_tokens=30,
              prefill_pairs=55.0)
    same = with_overrides(p, token_scale=1.0, time_scale=1.0)
    assert same.step_time(**kw) == p.step_time(**kw)  # type: ignore[arg-type]


def test_token_scale_charges_k_decode_steps_and_k_times_the_prefill() -> None:
    p, k = prof(), 4.0
    s = with_overrides(p, token_scale=k)
    # one emitted decode step over 2 seqs at 30 wire context = 4 steps at 120 context each
    assert s.step_time(decode_seqs=2, decode_ctx_tokens=30) == pytest.approx(
        4 * (0.01 + 2 * 0.001 + 120 * 0.0001))
    # a pure prefill step: one base, 4 x the tokens, 16 x the attention pairs
    assert s.step_time(prefill_tokens=10, prefill_seqs=1, prefill_pairs=55.0) == pytest.approx(
        0.01 + 40 * 0.0002 + 0.003 + 16 * 55 * 1e-6)
    assert s.kv_capacity_blocks == 640 // 4 // 4 and s.max_model_len == 64
    c = with_overrides(s, time_scale=10.0)
    assert c.step_time(decode_seqs=2, decode_ctx_tokens=30) == pytest.approx(
        s.step_time(decode_seqs=2, decode_ctx_tokens=30) / 10)


def test_scaled_engine_runs_a_request_in_compressed_time() -> None:
    def wall(p: LatencyProfile) -> float:
        from rollbank_bench.accelsim.tokens import TokenSource

        core = EngineCore(p)
        prompt = list(range(20))
        src = TokenSource(seed=0, namespace="n", prompt=prompt, vocab_size=p.vocab_size,
                          temperature=0.0, request_id="a")
        from rollbank_bench.accelsim.core import SimRequest

        core.add(SimRequest("a", prompt, 5, src, "n", min_tokens=5), 0.0)
        now = 0.0
        while (step := core.plan(now)) is not None:
            now += step.duration
            core.apply(step, now)
        return now

    base = wall(with_overrides(prof(), token_scale=4.0))
    assert wall(with_overrides(prof(), token_scale=4.0, time_scale=8.0)) == pytest.approx(base / 8)
    assert base > wall(prof())  # the same wire tokens stand for 4x the modelled work
