"""bench schedule --from-measured --at-trace-profile: the ablation predicted on an agent trace."""

from __future__ import annotations

from pathlib import Path

from rollbank_bench.schedule_measured import load_measured
from rollbank_bench.schedule_trace import arm_inputs_at_trace, predict_at_trace

MEASURED = (Path(__file__).resolve().parents[3] / "docs" / "measurements"
            / "bench-collect-accelsim-32x8-interleaved-quiet-2026-12-01-s8.json")


def test_each_arm_gets_its_collect_config_and_the_measured_host_costs() -> None:
    from rollbank_bench.schedule_trace import _collect_args

    report = load_measured(MEASURED)
    args = _collect_args(report, "tb2-reasoning", 16)
    rb = arm_inputs_at_trace(report, args, "ready_bank")
    op = arm_inputs_at_trace(report, args, "overprovision")
    assert (rb["scheduler"]["pool_groups"], rb["scheduler"]["straggler"]) == (32, "carry")
    assert (op["scheduler"]["pool_groups"], op["scheduler"]["straggler"]) == (64, "abort")
    assert rb["workload"]["tokens_median"] is not None  # the trace profile's workload
    warm = arm_inputs_at_trace(report, args, "all_but_routing")["costs"]["setup_s"]
    cold = arm_inputs_at_trace(report, args, "routing")["costs"]["setup_s"]
    assert warm == report["arms"]["optimized"]["sim_inputs"]["costs"]["setup_s"] < cold


def test_the_ready_bank_without_extra_groups_is_the_naive_schedule() -> None:
    report = load_measured(MEASURED)
    out = predict_at_trace(report, "tb2-reasoning", arm_names=("naive", "ready_bank"))
    arms = out["arms"]
    assert arms["naive"]["ratio_vs_naive"]["median"] == 1.0
    # G' = G: every batch needs all its groups, so carrying stragglers changes nothing here
    assert arms["ready_bank"]["time_per_batch_s"] == arms["naive"]["time_per_batch_s"]
    assert out["trace_profile"]["name"] == "tb2-reasoning" and out["servers"] == 16
