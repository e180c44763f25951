"""`rollbank bench routing`: rollbank's routers vs a peer router on real vLLM servers (JSON).

Starts ``--servers`` real vLLM servers (:class:`~rollbank.inference.server.ManagedServers`),
then replays one multi-turn GRPO workload (:mod:`rollbank.bench.routing_workload`) once per
arm: each rollbank policy (round_robin, least_loaded, sticky, cache_aware) routing in-process,
then ``vllm-router`` (PyPI, Rust) placed in front of the same servers with its cache_aware,
consistent_hash and sticky_least_loaded policies. Before each arm every server's prefix cache
is reset, so arms start equal; observations and pauses are seeded and identical per arm.

Peer caveats (how token-id prompts get through them):
- the prompt is sent as token ids to ``/v1/completions`` exactly as rollbank sends it to vLLM;
- consistent_hash and sticky_least_loaded key on the ``X-Session-ID`` header; we set it per
  trajectory, and in a second arm per GRPO group (siblings together) — the peer's best shot;
- cache_aware matches request *text* in a radix tree; for a token-id prompt that is whatever
  text the router derives from the id array (we do not control it), so its prefix matching
  is the peer's own. Its load thresholds are set to rollbank's (``--balance-abs-threshold``
  etc.) so both are tuned alike.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

DEFAULT_POLICIES = "round_robin,least_loaded,sticky,cache_aware"
DEFAULT_PEERS = (
    "cache_aware,consistent_hash:trajectory,consistent_hash:group,"
    "sticky_least_loaded:trajectory,sticky_least_loaded:group"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--json", action="store_true", help="print one JSON object (the default output anyway)")
    a("--quick", action="store_true", help="small workload (4 groups x 2, 3 turns) for a fast run")
    a("--model", default="tiny", help="model served by every server (default: tiny)")
    a("--servers", type=int, default=2, help="number of vLLM servers (>= 2)")
    a("--groups", type=int, default=8, help="GRPO groups")
    a("--group-size", type=int, default=4, help="siblings per group")
    a("--turns", type=int, default=6, help="turns per conversation")
    a("--header-tokens", type=int, default=128, help="prompt header shared by every group")
    a("--task-tokens", type=int, default=256, help="per-group task tokens (shared by siblings)")
    a("--obs-tokens", default="48,160", help="observation length range per turn, 'min,max'")
    a("--max-tokens", type=int, default=32, help="tokens generated per turn")
    a("--tool-pause", type=float, default=0.3, help="max seeded pause between turns (s)")
    a("--block-size", type=int, default=32, help="vLLM KV block size and router block size")
    a("--balance-abs", type=int, default=None,
      help="cache-aware absolute imbalance threshold (default: RouterConfig's), also the peer's")
    a("--balance-rel", type=float, default=None,
      help="cache-aware relative imbalance threshold (default: RouterConfig's), also the peer's")
    a("--policies", default=DEFAULT_POLICIES, help="rollbank policies to run, comma-separated")
    a("--peers", default=DEFAULT_PEERS,
      help="peer router arms '[vllm-router/|sglang-router/]policy[:trajectory|group]', "
      "comma-separated (router defaults to vllm-router); '' for none")
    a("--seed", type=int, default=0, help="workload seed")
    a("--temperature", type=float, default=1.0, help="sampling temperature (0: greedy)")
    a("--kv-cache-gib", type=float, default=1.0, help="VLLM_CPU_KVCACHE_SPACE per server")
    a("--repeats", type=int, default=1, help="rounds over all arms (order rotated); medians")
    a("--out", type=Path, default=None, help="also write the JSON object to this file")


def run(args: argparse.Namespace) -> int:
    import asyncio

    if args.quick:
        args.groups, args.group_size, args.turns = 4, 2, 3
    if args.servers < 2:
        print("bench routing needs --servers >= 2", file=sys.stderr)
        return 2
    report = asyncio.run(_main(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0 if not any("error" in arm for arm in report["arms"]) else 1


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from rollbank.bench.routing_peers import PEER_ROUTERS, PeerRouter, find_router
    from rollbank.bench.routing_workload import (
        ArmResult,
        Workload,
        bench_client,
        fixed_dispatch,
        peer_client,
        router_dispatch,
        run_arm,
    )
    from rollbank.clock import MonotonicClock
    from rollbank.inference.config import ServerConfig
    from rollbank.inference.protocol import GenerateRequest, InferenceClient, SamplingParams
    from rollbank.inference.server import ManagedServers
    from rollbank.routing.cache_aware import CacheAwareRouter
    from rollbank.routing.config import RouterConfig
    from rollbank.routing.factory import make_router

    defaults = RouterConfig()
    if args.balance_abs is None:
        args.balance_abs = defaults.balance_abs_threshold
    if args.balance_rel is None:
        args.balance_rel = defaults.balance_rel_threshold
    lo_obs, hi_obs = (int(x) for x in args.obs_tokens.split(","))
    cfg = ServerConfig.model_validate({
        "model": args.model, "num_servers": args.servers, "kv_cache_gib": args.kv_cache_gib,
        "extra_args": ["--block-size", str(args.block_size)],
    })
    async with ManagedServers(cfg) as fleet:
        urls = fleet.urls
        assert fleet.model_dir is not None
        model_cfg = json.loads((fleet.model_dir / "config.json").read_text())
        workload = Workload(
            groups=args.groups, group_size=args.group_size, turns=args.turns,
            header_tokens=args.header_tokens, task_tokens=args.task_tokens,
            obs_tokens=(lo_obs, hi_obs), max_tokens=args.max_tokens, tool_pause_s=args.tool_pause,
            vocab=(16, int(model_cfg["vocab_size"])), seed=args.seed,
            temperature=args.temperature,
        )
        clients: dict[str, InferenceClient] = {u: bench_client(u) for u in urls}
        # warm each engine once (first-request compilation), outside every arm
        for i, c in enumerate(fleet.clients):
            await c.generate(GenerateRequest(f"warmup-{i}", list(range(16, 80)), SamplingParams(
                max_tokens=4, temperature=0.0, logprobs=False)))

        async def reset() -> None:
            for c in fleet.clients:
                await c.reset_prefix_cache()

        async def rollbank_arm(policy: str) -> dict[str, Any]:
            router = make_router(
                policy, urls, MonotonicClock(), block_size=args.block_size,
                balance_abs_threshold=args.balance_abs, balance_rel_threshold=args.balance_rel,
            )
            dispatch, finish = router_dispatch(router, clients)
            res = await run_arm(ArmResult(f"rollbank:{policy}", "rollbank"), workload, urls,
                                dispatch, finish)
            if isinstance(router, CacheAwareRouter):
                res.extra["router_decisions"] = {
                    k: v for k, v in router.stats().items() if k.startswith("reason_")
                }
            return res.summary(urls, args.block_size)

        served_name = Path(cfg.model).name

        async def peer_arm(name: str, router_name: str, policy: str, by: str) -> dict[str, Any]:
            res = ArmResult(name, "peer")
            extra = (["--cache-threshold", "0.3", "--balance-abs-threshold", str(args.balance_abs),
                      "--balance-rel-threshold", str(args.balance_rel)]
                     if policy == "cache_aware" else [])
            binary = find_router(router_name)
            if binary is None:
                res.error = f"{router_name} not installed (pip install 'rollbank[peers]')"
                return res.summary(urls, args.block_size)
            try:
                async with PeerRouter(binary, urls, policy, extra) as peer:
                    client = peer_client(peer.url, served_name, by)
                    try:
                        await run_arm(res, workload, urls, *fixed_dispatch(client))
                    finally:
                        await client.aclose()
            except (OSError, TimeoutError, httpx.HTTPError, RuntimeError) as exc:
                res.error = f"peer router failed: {exc!r}"
            return res.summary(urls, args.block_size)

        specs: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = [
            (f"rollbank:{p}", functools.partial(rollbank_arm, p))
            for p in args.policies.split(",") if p
        ]
        for spec in [p for p in args.peers.split(",") if p]:
            router_name, _, rest = spec.rpartition("/")
            router_name = router_name or "vllm-router"
            if router_name not in PEER_ROUTERS:
                raise SystemExit(f"unknown peer router {router_name!r}; known: {PEER_ROUTERS}")
            policy, _, by = rest.partition(":")
            session = policy in ("consistent_hash", "sticky_least_loaded")
            name = f"{router_name}:{policy}" + (f"[session={by or 'trajectory'}]" if session else "")
            specs.append((name, functools.partial(peer_arm, name, router_name, policy,
                                                  by or "trajectory")))
        try:
            rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in specs}
            for r in range(args.repeats):
                k = r % len(specs)  # rotate the order each round so no arm always runs first
                for name, fn in specs[k:] + specs[:k]:
                    await reset()
                    rounds[name].append(await fn())
            arms = [merge_rounds(rounds[name]) for name, _ in specs]
        finally:
            for bc in clients.values():
                await bc.aclose()

    return {
        "bench": "routing",
        "model": args.model,
        "servers": args.servers,
        "workload": {
            "groups": args.groups, "group_size": args.group_size, "turns": args.turns,
            "conversations": args.groups * args.group_size,
            "header_tokens": args.header_tokens, "task_tokens": args.task_tokens,
            "obs_tokens": [lo_obs, hi_obs], "max_tokens": args.max_tokens,
            "tool_pause_s": args.tool_pause, "block_size": args.block_size, "seed": args.seed,
            "balance_abs": args.balance_abs, "balance_rel": args.balance_rel,
            "temperature": args.temperature,
        },
        "sources": {
            "uncached_and_repeated": "per request: usage.prompt_tokens_details.cached_tokens",
            "hit_rate": "/metrics deltas: vllm:prefix_cache_hits / vllm:prefix_cache_queries",
            "inflight": "/metrics running+waiting sampled every 0.25 s per server",
        },
        "repeats": args.repeats,
        "arms": arms,
        "summary": summarize(arms),
    }


def summarize(arms: list[dict[str, Any]]) -> dict[str, Any]:
    """Targets: avoidable repeated prefill cut >= 90% vs round-robin; hit rate matches (within
    ``HIT_RATE_TOLERANCE``) or beats the best peer's; imbalance no worse than that peer's."""
    by = {a["name"]: a for a in arms if "error" not in a}
    ours = by.get("rollbank:cache_aware")
    rr = by.get("rollbank:round_robin")
    out: dict[str, Any] = {}
    if ours and rr and rr.get("repeated_prefill_tokens"):
        raw = 1.0 - ours["repeated_prefill_tokens"] / rr["repeated_prefill_tokens"]
        out["repeated_prefill_cut_vs_round_robin_raw"] = round(raw, 4)
    if ours and rr and rr.get("repeated_prefill_tokens_full_blocks"):
        cut = 1.0 - (ours["repeated_prefill_tokens_full_blocks"]
                     / rr["repeated_prefill_tokens_full_blocks"])
        out["repeated_prefill_cut_vs_round_robin_full_blocks"] = round(cut, 4)
        out["target_repeated_cut_ge_90pct"] = cut >= 0.9
    peers = [a for a in by.values() if a["kind"] == "peer" and a.get("hit_rate") is not None]
    if ours and peers and ours.get("hit_rate") is not None:
        best = max(peers, key=lambda a: a["hit_rate"])
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
    return out


# Arms sample different tokens (temperature > 0), which moves prompt lengths by a few tokens
# per arm: hit rates within 0.1 point are a tie, not a win or a loss.
HIT_RATE_TOLERANCE = 0.001

ROUND_FIELDS = ("hit_rate", "repeated_prefill_tokens_full_blocks", "imbalance_max_over_min",
                "wall_s")


def merge_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm over several rounds: the median of every number, and key fields per round."""
    if len(rounds) == 1:
        return rounds[0]
    out = dict(rounds[0])
    for key, value in rounds[0].items():
        if (isinstance(value, int | float) and not isinstance(value, bool)) or value is None:
            vals = [r.get(key) for r in rounds]
            nums = [v for v in vals if isinstance(v, int | float)]
            out[key] = statistics.median(nums) if nums else None
    out["rounds"] = {k: [r.get(k) for r in rounds] for k in ROUND_FIELDS}
    errors = [r["error"] for r in rounds if "error" in r]
    if errors:
        out["error"] = " | ".join(errors)
    return out
