"""Pure parts of `rollbank bench routing`: workload, accounting, session keys, summary."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from rollbank_bench.routing import (
    apply_defaults,
    merged_report,
    parse_router_config,
    policy_variant,
)
from rollbank_bench.routing_peers import session_key
from rollbank_bench.routing_report import merge_rounds, merge_runs, move_diagnosis, summarize
from rollbank_bench.routing_workload import (
    ArmResult,
    RequestRecord,
    Workload,
    cacheable,
    client_ttft,
    percentile,
)


def wl(**kw: Any) -> Workload:
    base: dict[str, Any] = dict(groups=3, group_size=2, turns=4, header_tokens=8, task_tokens=16,
                                obs_tokens=(5, 9), max_tokens=4, tool_pause_s=0.1, vocab=(16, 100),
                                seed=3)
    base.update(kw)
    return Workload(**base)


def test_workload_is_seeded_and_groups_share_prompts() -> None:
    a, b = wl().conversations(), wl().conversations()
    assert a == b
    assert wl(seed=4).conversations() != a
    assert len(a) == 6
    assert a[0].prompt == a[1].prompt  # siblings share the prompt
    assert a[0].prompt[:8] == a[2].prompt[:8] and a[0].prompt != a[2].prompt  # header only
    assert a[0].observations != a[1].observations
    assert all(5 <= len(o) <= 9 for c in a for o in c.observations)
    assert all(16 <= t < 100 for c in a for t in c.prompt)


def test_cacheable_counts_full_blocks_before_the_last_token() -> None:
    assert cacheable(0, 100, 32) == 0
    assert cacheable(64, 200, 32) == 32  # the block holding the last seen token is not full KV
    assert cacheable(65, 200, 32) == 64
    assert cacheable(500, 100, 32) == 96  # never more than the prompt minus its last token


def test_session_keys_from_request_ids() -> None:
    rid = "vllm-router:consistent_hash-g3s1-t2"
    assert session_key("trajectory")(rid) == "g3s1"
    assert session_key("group")(rid) == "g3"


def test_arm_summary_repeated_prefill() -> None:
    arm = ArmResult("x", "rollbank")
    arm.records = [
        RequestRecord("g0s0", 0, "a", 100, 0, 0, 10),
        RequestRecord("g0s0", 1, "a", 150, 96, 110, 10),   # everything cacheable was cached
        RequestRecord("g0s0", 2, "b", 200, 0, 160, 10),    # moved: the whole context again
    ]
    arm.metrics_delta = [
        {"vllm:prefix_cache_hits_total": 96.0, "vllm:prefix_cache_queries_total": 250.0,
         "vllm:request_success_total": 2.0},
        {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 200.0,
         "vllm:request_success_total": 1.0},
    ]
    arm.samples = [[2, 1], [4, 1]]
    s = arm.summary(["a", "b"], 32)
    assert s["uncached_prefill_tokens"] == 450 - 96
    assert s["repeated_prefill_tokens"] == (110 - 96) + 160
    assert s["repeated_prefill_tokens_full_blocks"] == 0 + 128
    assert s["hit_rate"] == round(96 / 450, 4)
    assert s["imbalance_max_over_min"] == 3.0
    assert s["requests_per_server"] == [2, 1]
    assert s["affinity_moves"] == 1  # turn 2 left server a
    arm.records.append(RequestRecord("g0s1", 0, None, 10, 0, 0, 1))
    assert arm.summary(["a", "b"], 32)["affinity_moves"] is None  # behind a peer: unknown


def arm(name: str, kind: str, rep: int, hit: float, imb: float) -> dict[str, Any]:
    return {"name": name, "kind": kind, "repeated_prefill_tokens": rep + 100,
            "repeated_prefill_tokens_full_blocks": rep, "hit_rate": hit,
            "imbalance_max_over_min": imb, "wall_s": 1.0}


def test_summary_targets() -> None:
    arms = [arm("rollbank:round_robin", "rollbank", 1000, 0.7, 1.1),
            arm("rollbank:cache_aware", "rollbank", 50, 0.8325, 1.3),
            arm("vllm-router:x", "peer", 0, 0.8330, 1.6),
            arm("vllm-router:y", "peer", 0, 0.80, 1.0)]
    s = summarize(arms)
    assert s["repeated_prefill_cut_vs_round_robin_full_blocks"] == 0.95
    assert s["target_repeated_cut_ge_90pct"] is True
    assert s["best_peer"] == "vllm-router:x"
    assert s["target_hit_rate_matches_best_peer"] is True  # within the 0.001 tolerance
    assert s["target_imbalance_le_best_peer"] is True
    arms[1]["hit_rate"] = 0.83
    assert summarize(arms)["target_hit_rate_matches_best_peer"] is False


def test_merge_rounds_takes_medians() -> None:
    rounds = [arm("a", "peer", r, h, i) for r, h, i in ((3, 0.5, 1.0), (1, 0.7, 2.0), (2, 0.6, 9.0))]
    m = merge_rounds(rounds)
    assert m["repeated_prefill_tokens_full_blocks"] == 2
    assert m["hit_rate"] == 0.6
    assert m["imbalance_max_over_min"] == 2.0
    assert m["rounds"]["hit_rate"] == [0.5, 0.7, 0.6]
    one = merge_rounds(rounds[:1])
    assert {k: v for k, v in one.items() if k != "rounds"} == rounds[0]
    assert one["rounds"]["wall_s"] == [1.0]


def timed(name: str, kind: str, walls: list[float], p95s: list[float], hit: float) -> dict[str, Any]:
    rounds = [{**arm(name, kind, 0, hit, 1.0), "wall_s": w, "ttft_p95_s": t}
              for w, t in zip(walls, p95s, strict=True)]
    return merge_rounds(rounds)


def test_summary_time_targets_use_medians_and_count_pairwise_rounds() -> None:
    ours = timed("rollbank:cache_aware", "rollbank", [10.0, 12.0, 9.0], [0.5, 0.4, 0.9], 0.83)
    fast = timed("vllm-router:fast", "peer", [11.0, 11.5, 8.0], [0.6, 0.6, 0.6], 0.83)
    slow = timed("vllm-router:slow", "peer", [20.0, 20.0, 20.0], [0.3, 0.3, 0.3], 0.5)
    s = summarize([ours, fast, slow])
    assert s["fastest_peer"] == "vllm-router:fast"
    assert s["cache_aware_wall_s"] == 10.0 and s["fastest_peer_wall_s"] == 11.0
    assert s["target_wall_le_fastest_peer"] is True
    assert s["rounds_wall_le_fastest_peer"] == 1  # 10<=11 only; 12>11.5, 9>8
    assert s["best_ttft_peer"] == "vllm-router:slow"  # the lowest p95 of any peer
    assert s["target_ttft_p95_le_best_peer"] is False  # 0.5 > 0.3
    assert s["target_time_met"] is False
    slow_hits = timed("vllm-router:slow", "peer", [20.0] * 3, [0.6] * 3, 0.5)
    s = summarize([ours, fast, slow_hits])
    assert s["target_ttft_p95_le_best_peer"] is True and s["target_time_met"] is True


def test_percentile_nearest_rank_and_client_ttft() -> None:
    vals = [float(x) for x in range(1, 21)]  # 1..20
    assert percentile(vals, 50) == 10.0
    assert percentile(vals, 95) == 19.0
    assert percentile([3.0], 95) == 3.0
    assert percentile([], 50) is None
    assert client_ttft(2.0, 1.5) == 0.5
    assert client_ttft(2.0, None) is None
    assert client_ttft(1.0, 1.2) == 0.0  # clocks of two processes: never negative


def test_arm_summary_times_and_timeline() -> None:
    res = ArmResult("x", "rollbank", wall_s=3.0)
    res.records = [RequestRecord("g0s0", t, "a", 10, 0, 0, 2, t_send=t, t_done=t + 1.0,
                                 ttft_s=0.1 * (t + 1), queue_s=0.01) for t in range(4)]
    res.samples, res.sample_times = [[1, 0], [2, 1]], [0.0, 0.25]
    s = res.summary(["a", "b"], 32)
    assert s["ttft_p50_s"] == 0.2 and s["ttft_p95_s"] == 0.4 and s["ttft_measured"] == 4
    tl = res.timeline(["a", "b"])
    assert tl["requests"][1] == {"traj": "g0s0", "turn": 1, "server": 0, "send": 1.0,
                                 "first": 1.2, "done": 2.0, "queue": 0.01, "prompt": 10,
                                 "cached": 0}
    assert tl["depth"] == [[0.0, [1, 0]], [0.25, [2, 1]]]


def test_engine_defaults_and_router_config_parsing() -> None:
    ns = argparse.Namespace(engine="accel-sim", quick=False, turns=6, **dict.fromkeys(
        ("servers", "groups", "group_size", "header_tokens", "task_tokens", "obs_tokens",
         "max_tokens", "tool_pause")))
    ns.groups = 5
    apply_defaults(ns)
    assert ns.servers == 4 and ns.groups == 5 and ns.max_tokens == 128
    assert parse_router_config("balance_abs_threshold=4, cache_threshold=0.5,policy=x") == {
        "balance_abs_threshold": 4, "cache_threshold": 0.5, "policy": "x"}
    assert parse_router_config("") == {}
    assert policy_variant("cache_aware+session_idle_s=0+cache_threshold=0.5") == (
        "cache_aware", {"session_idle_s": 0, "cache_threshold": 0.5})
    assert policy_variant("sticky") == ("sticky", {})
    with pytest.raises(ValueError):
        parse_router_config("nokey")


def test_move_diagnosis_compares_in_flight_with_live_conversations() -> None:
    def rec(traj: str, turn: int, server: str, send: float, done: float) -> RequestRecord:
        return RequestRecord(traj, turn, server, 10, 0, 0, 1, t_send=send, t_done=done)

    records = [
        rec("c0", 0, "a", 0.0, 1.0), rec("c0", 1, "a", 1.5, 2.5),  # in a tool call at t=2.6
        rec("c1", 0, "a", 0.0, 1.0), rec("c1", 1, "b", 2.6, 3.0),  # moved at t=2.6
        rec("c2", 0, "b", 0.0, 1.0), rec("c2", 1, "b", 2.0, 4.0),  # in flight at t=2.6
        rec("c3", 0, "b", 0.0, 0.5), rec("c3", 1, "b", 0.6, 0.9),
        rec("c3", 2, "b", 1.0, 1.2),  # all 3 turns answered: not live
    ]
    moves = move_diagnosis(records, ["a", "b"], turns=3)
    assert moves == [{"t": 2.6, "trajectory": "c1", "turn": 1, "from": 0, "to": 1,
                      "in_flight": [0, 1], "conversations": [2, 1]}]
    m = merge_rounds([{**arm("x", "rollbank", 0, 0.5, 1.0), "affinity_move_detail": moves},
                      {**arm("x", "rollbank", 0, 0.5, 1.0), "affinity_move_detail": []}])
    assert "affinity_move_detail" not in m and m["rounds"]["affinity_move_detail"] == [moves, []]


def _run(walls: list[float], p95s: list[float], workload: dict[str, Any]) -> dict[str, Any]:
    ours = timed("rollbank:cache_aware", "rollbank", walls, p95s, 0.83)
    ours["engine_ttft_p50_s"], ours["ttft_p50_s"] = 0.05, 0.25
    ours["rounds"]["ttft_p50_s"] = [0.25] * len(walls)
    peer = timed("vllm-router:p", "peer", [8.0] * len(walls), [0.7] * len(walls), 0.83)
    return {"bench": "routing", "engine": "vllm", "model": "tiny", "servers": 2,
            "workload": workload, "repeats": len(walls), "arms": [ours, peer],
            "summary": summarize([ours, peer])}


def test_merge_runs_pools_every_round_and_refuses_another_workload(tmp_path: Path) -> None:
    # one run loses on wall (median 9 > 8), the other wins (median 7): pooled over all six
    # rounds the median is 7.0, and the pooled p95 (0.7) is judged the same way
    a = _run([9.0, 9.5, 1.0], [0.9, 0.9, 0.9], {"groups": 8})
    b = _run([7.0, 7.0, 6.0], [0.5, 0.5, 0.5], {"groups": 8})
    assert a["summary"]["target_wall_le_fastest_peer"] is False
    pooled = {x["name"]: x for x in merge_runs([a, b])}
    ours = pooled["rollbank:cache_aware"]
    assert ours["rounds"]["wall_s"] == [9.0, 9.5, 1.0, 7.0, 7.0, 6.0]
    assert ours["wall_s"] == 7.0 and ours["ttft_p95_s"] == 0.7
    paths = []
    for i, run in enumerate((a, b)):
        paths.append(tmp_path / f"r{i}.json")
        paths[-1].write_text(json.dumps(run))
    report = merged_report(paths)
    assert report["repeats"] == 6 and len(report["runs"]) == 2
    s = report["summary"]
    assert s["target_wall_le_fastest_peer"] is True and s["target_ttft_p95_le_best_peer"] is True
    assert s["cache_aware_ttft_outside_engine_share_p50"] == 0.8  # 1 - 0.05 / 0.25
    other = tmp_path / "other.json"
    other.write_text(json.dumps(_run([1.0], [0.1], {"groups": 4})))
    with pytest.raises(ValueError, match="workload differs"):
        merged_report([paths[0], other])
    (tmp_path / "bad.json").write_text(json.dumps({"bench": "collect"}))
    with pytest.raises(ValueError, match=r"bad\.json: not a `rollbank bench routing` JSON"):
        merged_report([tmp_path / "bad.json"])
