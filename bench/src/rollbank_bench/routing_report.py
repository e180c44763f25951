"""The report of ``rollbank bench routing``: rounds merged per arm, and the targets.

Owns :func:`merge_rounds` (one arm over rotated repeats: the median of every number, the key
fields per round) and :func:`summarize` (the targets, judged on the medians):

- prefill: cache_aware cuts avoidable repeated prefill >= 90% vs round-robin;
- hit rate: cache_aware within ``HIT_RATE_TOLERANCE`` of, or above, the best peer's;
- time: cache_aware's wall time <= the fastest peer's and its p95 time to first token <= the
  lowest peer p95 (each the median over rounds); ``rounds_won`` counts the rounds where it
  also won pairwise (same round, so host drift hits both alike).

:func:`merge_runs` pools the rounds of several runs of one workload (``--merge``), so the
targets can be judged over more rounds than one run holds. The summary also says where the
time to first token goes: the engine's part and the share of the median outside it.

And :func:`move_diagnosis`: where an arm's affinity moves came from (in-flight vs live
conversations per server at each move).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence
from typing import Any

from rollbank_bench.routing_workload import RequestRecord

# Arms sample different tokens (temperature > 0), which moves prompt lengths by a few tokens
# per arm: hit rates within 0.1 point are a tie, not a win or a loss.
HIT_RATE_TOLERANCE = 0.001

ROUND_FIELDS = ("hit_rate", "repeated_prefill_tokens_full_blocks", "imbalance_max_over_min",
                "wall_s", "ttft_p50_s", "ttft_p95_s", "affinity_moves", "order",
                "affinity_move_detail")


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm over several rounds: the median of every number, and key fields per round."""
    out = dict(rounds[0])
    for key, value in rounds[0].items():
        if (isinstance(value, int | float) and not isinstance(value, bool)) or value is None:
            vals = [r.get(key) for r in rounds]
            nums = [v for v in vals if isinstance(v, int | float) and not isinstance(v, bool)]
            out[key] = statistics.median(nums) if nums else None
    out["rounds"] = {k: [r.get(k) for r in rounds] for k in ROUND_FIELDS}
    out.pop("affinity_move_detail", None)  # per round only
    if all(v is None for v in out["rounds"]["affinity_move_detail"]):
        del out["rounds"]["affinity_move_detail"]
    errors = [r["error"] for r in rounds if "error" in r]
    if errors:
        out["error"] = " | ".join(errors)
    return out


def _pairwise_wins(ours: dict[str, Any], peer: dict[str, Any], key: str) -> int | None:
    a, b = ours.get("rounds", {}).get(key), peer.get("rounds", {}).get(key)
    if not a or not b:
        return None
    return sum(1 for x, y in zip(a, b, strict=False)
               if x is not None and y is not None and x <= y)


def _outside_share(arm: dict[str, Any]) -> float | None:
    """Share of the median client time to first token spent outside the engine."""
    client, engine = arm.get("ttft_p50_s"), arm.get("engine_ttft_p50_s")
    if not client or engine is None:
        return None
    return round(max(0.0, 1.0 - float(engine) / float(client)), 3)


def merge_runs(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Arms of several runs of one workload pooled round by round: each arm's round fields over
    every round of every run (medians over all of them), its other numbers the median over runs
    weighted by their rounds. An arm missing from a run is pooled over the runs that have it."""
    pooled: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        for arm in run["arms"]:
            per_round = arm.get("rounds") or {}
            n = len(per_round.get("wall_s") or [None])
            base = {k: v for k, v in arm.items() if k != "rounds"}
            for i in range(n):
                row = dict(base)
                for k, values in per_round.items():
                    row[k] = values[i] if i < len(values) else None
                pooled.setdefault(arm["name"], []).append(row)
    return [merge_rounds(rows) for rows in pooled.values()]


def summarize(arms: list[dict[str, Any]], name: str = "rollbank:cache_aware") -> dict[str, Any]:
    """The targets for arm ``name`` against round-robin and the peers (see the module doc)."""
    by = {a["name"]: a for a in arms if "error" not in a}
    ours = by.get(name)
    rr = by.get("rollbank:round_robin")
    out: dict[str, Any] = {"judged_arm": name}
    if ours and rr and rr.get("repeated_prefill_tokens"):
        raw = 1.0 - ours["repeated_prefill_tokens"] / rr["repeated_prefill_tokens"]
        out["repeated_prefill_cut_vs_round_robin_raw"] = round(raw, 4)
    if ours and rr and rr.get("repeated_prefill_tokens_full_blocks"):
        cut = 1.0 - (ours["repeated_prefill_tokens_full_blocks"]
                     / rr["repeated_prefill_tokens_full_blocks"])
        out["repeated_prefill_cut_vs_round_robin_full_blocks"] = round(cut, 4)
        out["target_repeated_cut_ge_90pct"] = cut >= 0.9
    peers = [a for a in by.values() if a["kind"] == "peer"]
    if not ours or not peers:
        return out
    with_hits = [a for a in peers if a.get("hit_rate") is not None]
    if with_hits and ours.get("hit_rate") is not None:
        best = max(with_hits, key=lambda a: a["hit_rate"])
        out["best_peer"] = best["name"]
        out["best_peer_hit_rate"] = best["hit_rate"]
        out["cache_aware_hit_rate"] = ours["hit_rate"]
        out["hit_rate_delta_vs_best_peer"] = round(ours["hit_rate"] - best["hit_rate"], 4)
        out["hit_rate_tolerance"] = HIT_RATE_TOLERANCE
        out["target_hit_rate_matches_best_peer"] = (
            ours["hit_rate"] >= best["hit_rate"] - HIT_RATE_TOLERANCE
        )
        oi, pi = ours["imbalance_max_over_min"], best["imbalance_max_over_min"]
        out["cache_aware_imbalance"] = oi
        out["best_peer_imbalance"] = pi
        if oi is not None and pi is not None:
            out["target_imbalance_le_best_peer"] = oi <= pi
    timed = [a for a in peers if a.get("wall_s")]
    if timed and ours.get("wall_s"):
        fastest = min(timed, key=lambda a: a["wall_s"])
        out["fastest_peer"] = fastest["name"]
        out["fastest_peer_wall_s"] = fastest["wall_s"]
        out["cache_aware_wall_s"] = ours["wall_s"]
        out["wall_ratio_vs_fastest_peer"] = round(ours["wall_s"] / fastest["wall_s"], 4)
        out["target_wall_le_fastest_peer"] = ours["wall_s"] <= fastest["wall_s"]
        out["rounds_wall_le_fastest_peer"] = _pairwise_wins(ours, fastest, "wall_s")
    with_ttft = [a for a in peers if a.get("ttft_p95_s") is not None]
    if with_ttft and ours.get("ttft_p95_s") is not None:
        best_t = min(with_ttft, key=lambda a: a["ttft_p95_s"])
        out["best_ttft_peer"] = best_t["name"]
        out["best_peer_ttft_p95_s"] = best_t["ttft_p95_s"]
        out["cache_aware_ttft_p95_s"] = ours["ttft_p95_s"]
        out["target_ttft_p95_le_best_peer"] = ours["ttft_p95_s"] <= best_t["ttft_p95_s"]
        out["rounds_ttft_p95_le_best_peer"] = _pairwise_wins(ours, best_t, "ttft_p95_s")
        # where the time to first token goes: the engine's own part (arrival at the engine to
        # first token) vs the rest (client, HTTP front end, host scheduling)
        for label, arm in (("cache_aware", ours), ("best_ttft_peer", best_t)):
            out[f"{label}_engine_ttft_p95_s"] = arm.get("engine_ttft_p95_s")
            out[f"{label}_ttft_outside_engine_share_p50"] = _outside_share(arm)
    keys = ("target_wall_le_fastest_peer", "target_ttft_p95_le_best_peer",
            "target_hit_rate_matches_best_peer")
    if all(k in out for k in keys):
        out["target_time_met"] = all(out[k] for k in keys)
    return out


def move_diagnosis(
    records: Sequence[RequestRecord], servers: Sequence[str], turns: int, limit: int = 20
) -> list[dict[str, Any]]:
    """For each affinity move (a turn sent to another server than its conversation's previous
    turn), the load the servers had at that moment, measured two ways: requests in flight, and
    live conversations (started, last turn not answered) by the server of their latest turn.
    A move made while conversations were even but in-flight counts were not is a move on a
    transient signal. At most ``limit`` moves, earliest first."""
    index = {s: i for i, s in enumerate(servers)}
    by_conv: dict[str, list[RequestRecord]] = {}
    for r in records:
        by_conv.setdefault(r.trajectory_id, []).append(r)
    for recs in by_conv.values():
        recs.sort(key=lambda r: r.turn)
    out: list[dict[str, Any]] = []
    for recs in by_conv.values():
        for a, b in itertools.pairwise(recs):
            if a.server == b.server or a.server is None or b.server is None:
                continue
            t = b.t_send
            in_flight = [0] * len(servers)
            for r in records:
                if r.server is not None and r.t_send < t < r.t_done:
                    in_flight[index[r.server]] += 1
            live = [0] * len(servers)
            for other in by_conv.values():
                sent = [r for r in other if r.t_send < t]
                done = len(sent) == turns and sent[-1].t_done <= t
                if sent and not done and sent[-1].server is not None:
                    live[index[sent[-1].server]] += 1
            out.append({"t": round(t, 3), "trajectory": b.trajectory_id, "turn": b.turn,
                        "from": index[a.server], "to": index[b.server],
                        "in_flight": in_flight, "conversations": live})
    return sorted(out, key=lambda m: m["t"])[:limit]
