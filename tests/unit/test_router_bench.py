"""Pure parts of `rollbank bench routing`: workload, accounting, session keys, summary."""

from __future__ import annotations

from typing import Any

from rollbank.bench.routing import merge_rounds, summarize
from rollbank.bench.routing_workload import (
    ArmResult,
    RequestRecord,
    Workload,
    cacheable,
    session_key,
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
    assert merge_rounds(rounds[:1]) == rounds[0]
