"""bench collect: arm configurations (same capacity and seeds) and the comparison arithmetic."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rollbank.bench.collect import (
    ARMS,
    DEFAULT_ARMS,
    _quick,
    add_arguments,
    arm_config,
    parse_arms,
)
from rollbank.bench.collect_compare import compare_arms as _compare
from rollbank.errors import UsageError


def args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args(list(argv))


def test_arms_differ_only_in_their_levers() -> None:
    a = args("--groups", "8", "--group-size", "4", "--pool-groups", "10")
    cfgs = {name: arm_config(a, name) for name in ARMS}
    naive, opt = cfgs["naive"], cfgs["optimized"]
    assert (naive.scheduler.mode.value, naive.scheduler.pool_groups) == ("naive", 8)
    assert naive.router.policy.value == "round_robin" and naive.sandbox.warm is False
    assert (opt.scheduler.mode.value, opt.scheduler.pool_groups) == ("optimized", 10)
    assert opt.router.policy.value == "cache_aware" and opt.sandbox.warm is True
    assert cfgs["routing"].router.policy.value == "cache_aware" and not cfgs["routing"].sandbox.warm
    assert cfgs["sandboxes"].sandbox.warm and cfgs["sandboxes"].scheduler.mode.value == "naive"
    assert cfgs["bank"].scheduler.pool_groups == 10 and not cfgs["bank"].sandbox.warm
    for c in cfgs.values():  # same capacity, seeds, tasks, episode limits for every arm
        assert c.scheduler.sandbox_slots == naive.scheduler.sandbox_slots
        assert c.scheduler.inference_slots_per_server == naive.scheduler.inference_slots_per_server
        assert (c.scheduler.seed, c.task_order_seed) == (0, 0)
        assert c.runner == naive.runner and c.fenced_shell == naive.fenced_shell
        assert c.inference.managed == naive.inference.managed
        assert c.scheduler.bank.group_size == 4


def test_naive_cold_start_uses_cached_layers_rebuild_is_a_labelled_variant() -> None:
    a = args()
    assert "naive_rebuild" not in DEFAULT_ARMS and parse_arms(a.arms) == list(DEFAULT_ARMS)
    naive, rebuild = arm_config(a, "naive"), arm_config(a, "naive_rebuild")
    assert naive.sandbox.warm is False and naive.sandbox.cold_rebuild is False
    assert rebuild.sandbox.warm is False and rebuild.sandbox.cold_rebuild is True
    assert rebuild.model_dump(exclude={"sandbox", "output"}) == naive.model_dump(exclude={"sandbox", "output"})
    assert all(not arm_config(a, n).sandbox.cold_rebuild for n in DEFAULT_ARMS)
    with pytest.raises(UsageError, match="nope"):
        parse_arms("naive,nope")


def test_quick_size() -> None:
    a = args("--quick")
    _quick(a)
    assert a.groups * a.group_size == 16 and a.pool_groups > a.groups


def _arm(t: float, complete: int = 1) -> dict[str, object]:
    return {"time_per_batch_s": t, "complete_batches": complete, "batch_times_s": [t]}


def test_comparison_ratios_and_lever_shares() -> None:
    c = _compare({"naive": _arm(100.0), "routing": _arm(90.0), "sandboxes": _arm(70.0),
                  "bank": _arm(80.0), "optimized": _arm(40.0)})
    assert c["headline_ratio"] == 0.4 and c["headline_reduction_pct"] == 60.0
    assert c["sandboxes"]["saved_s"] == 30.0 and c["routing"]["ratio_vs_naive"] == 0.9
    assert c["lever_share_of_total_saving"] == {"routing": pytest.approx(10 / 60, abs=1e-3),
                                                "sandboxes": 0.5,
                                                "bank": pytest.approx(20 / 60, abs=1e-3)}
    assert c["arms_with_incomplete_batches"] == [] and "warning" not in c


def test_comparison_flags_incomplete_batches() -> None:
    c = _compare({"naive": _arm(100.0, complete=0), "optimized": _arm(40.0)})
    assert c["arms_with_incomplete_batches"] == ["naive"] and "warning" in c
    assert _compare({"optimized": _arm(1.0)}) == {"note": "no naive arm result"}


def test_waste_counts_every_waste_event_including_at_close(tmp_path: Path) -> None:
    from rollbank.bench.collect import waste_from_events

    p = tmp_path / "events.jsonl"
    p.write_text("\n".join(json.dumps(e) for e in [
        {"kind": "launched", "t": 0},
        {"kind": "waste", "t": 5, "reason": "unconsumed_at_close", "held_s": 4.5},
        {"kind": "waste", "t": 6, "reason": "aborted", "held_s": 1.5},
        {"kind": "waste", "t": 7, "reason": "unconsumed_at_close", "held_s": 2.0},
    ]) + "\n")
    assert waste_from_events(p) == {"attempts": 3, "sandbox_s": 8.0,
                                    "by_reason": {"unconsumed_at_close": 2, "aborted": 1}}


def test_workload_choice_reaches_every_arm() -> None:
    trace = args("--trace", "turns_median=5", "--trace", "tool_latency_median_s=0.5")
    for name in ARMS:
        c = arm_config(trace, name)
        assert c.workload.kind == "trace" and c.workload.turns_median == 5.0
        assert c.workload.tool_latency_median_s == 0.5 and c.runner.max_model_len == 4096
    model = arm_config(args("--workload", "model", "--max-turns", "4"), "optimized")
    assert model.workload.kind == "model" and model.runner.max_turns == 4


def test_bank_lever_defaults_per_engine_launch_cap_and_pool() -> None:
    from rollbank.bench.collect import bank_lever

    # accel-sim: G' = 2 G, launches capped at the window's groups plus ceil(G/4) spare
    a = args("--engine", "accel-sim", "--groups", "8", "--batches", "2")
    assert bank_lever(a) == (16, 18)
    opt, naive = arm_config(a, "optimized").scheduler, arm_config(a, "naive").scheduler
    assert (opt.pool_groups, opt.max_groups) == (16, 18)
    assert (naive.pool_groups, naive.max_groups) == (8, None)  # the baseline is untouched
    assert bank_lever(args("--engine", "accel-sim", "--groups", "32", "--batches", "2")) == (64, 72)
    # one batch: G' never above the cap
    assert bank_lever(args("--engine", "accel-sim", "--groups", "8", "--batches", "1")) == (10, 10)
    # explicit settings win; -1: no cap
    assert bank_lever(args("--engine", "accel-sim", "--groups", "8", "--pool-groups", "12",
                           "--spare-groups", "-1")) == (12, None)
    assert bank_lever(args("--engine", "accel-sim", "--groups", "8", "--spare-groups", "1",
                           "--batches", "3")) == (16, 25)
    # the CPU regime keeps its defaults
    assert bank_lever(args()) == (48, None)
    assert bank_lever(args("--groups", "8", "--spare-groups", "2", "--batches", "2")) == (48, 18)
