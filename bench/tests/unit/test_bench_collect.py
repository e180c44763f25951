"""bench collect: arm configurations (same capacity and seeds) and the comparison arithmetic."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rollbank.errors import UsageError
from rollbank_bench.collect import (
    ARMS,
    DEFAULT_ARMS,
    _quick,
    add_arguments,
    arm_config,
    parse_arms,
)
from rollbank_bench.collect_compare import compare_arms as _compare


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
    from rollbank_bench.collect import waste_from_events

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



def test_an_agent_harness_reaches_every_arm_and_needs_the_model_workload() -> None:
    a = args("--workload", "model", "--harness", "agent", "--agent-entry",
             "rollbank.agents.smolagents_agent:agent", "--agent-step-limit", "3")
    for name in ARMS:
        c = arm_config(a, name)
        assert (c.harness, c.agent.entry) == ("agent", "rollbank.agents.smolagents_agent:agent")
        assert c.agent.options == {"step_limit": 3}
    assert arm_config(args("--workload", "model"), "naive").harness == \
        arm_config(args(), "naive").harness  # no --harness: the collector's default
    with pytest.raises(UsageError, match="--workload model"):
        arm_config(args("--harness", "chat"), "naive")


def test_bank_lever_defaults_per_engine_launch_cap_and_pool() -> None:
    from rollbank_bench.collect import bank_lever

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


def test_ablation_arms_split_the_bank_into_its_two_levers() -> None:
    from rollbank_bench.collect_args import ABLATION_ARMS, LEVERS

    a = args("--engine", "accel-sim", "--groups", "8", "--batches", "2")
    arms = parse_arms("ablation")
    assert arms[0] == "naive" and "naive#2" in arms and len(arms) == len(ABLATION_ARMS)
    cfg = {n: arm_config(a, n).scheduler for n in arms}
    rb, op = cfg["ready_bank"], cfg["overprovision"]
    # the ready bank alone: G' = G, stragglers carried, infra failures re-run in their slot
    assert (rb.mode.value, rb.pool_groups, rb.straggler.value, rb.bank.max_retries) == (
        "optimized", 8, "carry", 2)
    # over-provisioning alone: G' = 2 G, the first G complete groups, the open ones aborted
    assert (op.mode.value, op.pool_groups, op.straggler.value, op.bank.max_retries) == (
        "optimized", 16, "abort", 0)
    assert cfg["all_but_overprovision"].pool_groups == 8
    assert cfg["all_but_ready_bank"].straggler.value == "abort"
    assert cfg["naive#2"] == cfg["naive"]
    for lv in LEVERS:  # each all-but arm is all levers minus exactly one
        on = ARMS[f"all_but_{lv}"]
        assert not on[lv] and sum(on.values()) == len(LEVERS) - 1
    assert arm_config(a, "all_but_routing").router.policy.value != "cache_aware"
    assert not arm_config(a, "all_but_sandboxes").sandbox.warm


def test_trace_profile_sets_the_workload_and_context_and_trace_overrides_win() -> None:
    a = args("--trace-profile", "tb2-reasoning", "--time-scale", "10", "--trace", "max_turns=9")
    c = arm_config(a, "naive")
    assert c.workload.tokens_median is not None and c.workload.observation_chars_median > 0
    assert c.workload.max_turns == 9 and c.runner.max_model_len == 8192
    assert c.inference.managed.max_model_len == 8192
    slow = arm_config(args("--trace-profile", "tb2-reasoning", "--time-scale", "5"), "naive")
    assert slow.workload.tool_latency_median_s == pytest.approx(
        2 * c.workload.tool_latency_median_s, rel=1e-3)
    assert arm_config(args("--include", "a-task,b-task"), "naive").include == ["a-task", "b-task"]


def test_ablation_rows_and_each_levers_contribution() -> None:
    from rollbank_bench.collect_compare import ablation

    def arm(t: float, **kw: object) -> dict[str, object]:
        return {**_arm(t), **kw}

    arms = {"naive": arm(100.0), "naive#2": arm(120.0),
            "optimized": arm(30.0, efficiency=0.9, ledger={"launched": 200},
                             waste={"attempts": 20}, tail_share=[0.1, 0.3],
                             inference_idle_waiting_env_s=[4.0, 6.0],
                             lower_bound_terms=[{"binding_term": "verifier_work"}]),
            "sandboxes": arm(88.0), "all_but_sandboxes": arm(45.0),
            "overprovision": arm(60.0, complete_batches=0)}  # incomplete: not comparable
    a = ablation(arms)
    assert a["naive_s"] == 110.0 and a["naive_runs_s"] == [100.0, 120.0]
    row = a["arms"]["optimized"]
    assert row["ratio_vs_naive"] == round(30 / 110, 3) and row["waste_share_of_launched"] == 0.1
    assert row["tail_share_mean"] == 0.2 and row["inference_idle_waiting_env_s_per_batch"] == 5.0
    assert row["binding_terms"] == ["verifier_work"] and row["efficiency"] == 0.9
    assert a["levers"]["sandboxes"] == {"alone_ratio_vs_naive": 0.8,
                                        "removed_from_all_ratio_vs_all": 1.5}
    assert a["levers"]["overprovision"]["alone_ratio_vs_naive"] is None
    assert a["all_levers_ratio_vs_naive"] == round(30 / 110, 3)
    assert [r["name"] for r in a["table"]] == list(arms) and a["table"][2] == {
        "name": "optimized", **row}


def test_default_tasks_keep_the_embedded_selection_own_tasks_are_all_collected(tmp_path: Path) -> None:
    """Named tasks replace the embedded default's ``include`` (issue 29) and the bench always
    names its tasks: without this the default bench silently went from the embedded
    default's two tasks (every earlier measurement) to the whole suite."""
    from rollbank.collect_config import load_collect_config

    embedded = list(load_collect_config(None, {}).include)
    assert embedded  # a premise: the embedded default selects some tasks
    assert arm_config(args(), "naive").include == embedded
    assert arm_config(args("--include", ""), "naive").include == []
    assert arm_config(args("--include", "count-lines"), "naive").include == ["count-lines"]
    assert arm_config(args("--tasks", str(tmp_path)), "naive").include == []


def test_the_engines_busy_share_is_per_server_and_per_batch() -> None:
    from rollbank_bench.collect import busy_share

    assert busy_share([30.0, 10.0, 0.0], [20.0, 10.0, 0.0], 2) == [0.75, 0.5, None]


def test_the_verifier_wait_is_from_an_episodes_last_span_to_its_verdict() -> None:
    from rollbank.episodes.spans import Span, add_span
    from rollbank.episodes.trajectory import Trajectory
    from rollbank_bench.collect import verifier_wait_s

    waited = Trajectory(trajectory_id="a", group_id="g", task_id="t", attempt=0)
    for kind, start, end in [("episode", 0.0, 9.0), ("inference", 0.0, 1.0), ("exec", 1.0, 3.0),
                             ("verify", 7.5, 8.0)]:
        add_span(waited, Span(kind, start, end, "a"))  # type: ignore[arg-type]
    unverified = Trajectory(trajectory_id="b", group_id="g", task_id="t", attempt=1)
    add_span(unverified, Span("exec", 0.0, 2.0, "b"))
    assert verifier_wait_s([waited, unverified]) == 4.5
