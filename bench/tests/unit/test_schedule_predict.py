"""bench schedule --from-measured --at-size: a measured run's inputs at another size, and the
lower-bound terms from the plans, on hand cases."""

from __future__ import annotations

from typing import Any

import pytest

from rollbank.errors import UsageError
from rollbank_bench.schedule_predict import bounds, parse_size, predict, resize
from rollbank_bench.sim_inputs import ArmCosts

WL = {"kind": "trace", "turns_median": 3.0, "tool_latency_median_s": 2.0}


def _inputs(mode: str, costs: ArmCosts) -> dict[str, Any]:
    sched = {"mode": mode, "groups_per_batch": 2, "pool_groups": 2 if mode == "naive" else 4,
             "max_groups": None, "num_batches": 1, "sandbox_slots": 8,
             "inference_slots_per_server": 8, "verifier_slots": 2,
             "straggler": "wait" if mode == "naive" else "carry", "seed": 0,
             "bank": {"group_size": 2, "min_valid": 1}}
    return {"scheduler": sched, "workload": WL, "task_ids": ["a", "b"], "budgets": {},
            "costs": costs.to_dict()}


def _report(costs: ArmCosts | None = None) -> dict[str, Any]:
    c = costs or ArmCosts(setup_s=0.5, verify_s=0.3, close_s=1.0)
    return {"benchmark": "collect",
            "engine": {"kind": "accel-sim", "profile": "h100-llama3.1-8b", "servers": 1},
            "arms": {"naive": {"sim_inputs": _inputs("naive", c)},
                     "optimized": {"sim_inputs": _inputs("optimized", c)}}}


def test_size_is_parsed_or_refused() -> None:
    assert parse_size("32,8,4") == (32, 8, 4)
    for bad in ("32,8", "a,b,c", "32,0,4"):
        with pytest.raises(UsageError):
            parse_size(bad)


def test_resize_sets_the_size_and_the_bank_lever_like_bench_collect() -> None:
    r = _report()
    out = resize(r, 32, 8, 4, slots=512, verify_scale=3.0)
    n, o = (out["arms"][k]["sim_inputs"] for k in ("naive", "optimized"))
    assert (n["scheduler"]["pool_groups"], n["scheduler"]["max_groups"]) == (32, None)
    assert (o["scheduler"]["pool_groups"], o["scheduler"]["max_groups"]) == (64, 4 * 32 + 8)
    assert o["scheduler"]["bank"]["group_size"] == 8 and n["scheduler"]["sandbox_slots"] == 512
    assert o["costs"]["verify_s"] == pytest.approx(0.9)
    assert r["arms"]["naive"]["sim_inputs"]["scheduler"]["groups_per_batch"] == 2  # a copy
    capped = resize(r, 8, 2, 2, pool=40, spare=0)["arms"]["optimized"]["sim_inputs"]
    assert (capped["scheduler"]["pool_groups"], capped["scheduler"]["max_groups"]) == (16, 16)


def test_resize_sets_the_bank_arms_verifier_gate_only_when_asked() -> None:
    r = _report()
    for hold in (True, False):
        out = resize(r, 8, 2, 2, hold_for_verifier=hold)["arms"]
        assert out["optimized"]["sim_inputs"]["scheduler"]["hold_extras_for_verifier"] is hold
        assert "hold_extras_for_verifier" not in out["naive"]["sim_inputs"]["scheduler"]
    kept = resize(r, 8, 2, 2)["arms"]["optimized"]["sim_inputs"]["scheduler"]
    assert kept.get("hold_extras_for_verifier") == r["arms"]["optimized"]["sim_inputs"][
        "scheduler"].get("hold_extras_for_verifier")


def test_verifier_and_sandbox_work_terms_are_the_hand_arithmetic() -> None:
    r = resize(_report(ArmCosts(setup_s=0.5, verify_s=2.0, close_s=1.0)), 4, 2, 1)
    b = bounds(r, r["arms"]["naive"]["sim_inputs"], seed=0)
    assert b["verifier_work_s"] == pytest.approx(4 * 2 * 2.0 / 2)  # G x N x v / slots
    assert b["t_lb_s"] == max(b["path_s"], b["verifier_work_s"], b["sandbox_work_s"])
    # the bank arm's path term is the G-th smallest of more groups: never above naive's
    ob = bounds(r, r["arms"]["optimized"]["sim_inputs"], seed=0)
    assert ob["path_s"] <= b["path_s"]


def test_predict_reports_each_arm_and_the_ratio_on_the_same_seeds() -> None:
    r = resize(_report(), 4, 2, 2)
    p = predict(r, seeds=2)
    n, o = p["arms"]["naive"], p["arms"]["optimized"]
    assert len(n["time_per_batch_s"]) == len(o["time_per_batch_s"]) == 2
    ratios = [t / b for t, b in zip(o["time_per_batch_s"], n["time_per_batch_s"], strict=True)]
    assert o["ratio_vs_naive"]["max"] == pytest.approx(max(ratios), abs=1e-3)
    assert "ratio_vs_naive" not in n


def test_naive_path_term_is_what_the_simulator_takes_without_contention() -> None:
    r = resize(_report(), 2, 2, 3)  # 2 groups x 2, 3 batches; slots and verifiers to spare
    p = predict(r, seeds=1)["arms"]["naive"]
    assert p["time_per_batch_s"][0] == pytest.approx(p["bounds"]["path_s"], rel=0.01)
