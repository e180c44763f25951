"""`rollbank bench routing`: rollbank's routers vs peer routers, judged on time and cache (JSON).

Starts ``--servers`` engines (``--engine vllm``: real vLLM servers; ``accel-sim``: emulated
accelerators, :mod:`rollbank_bench.routing_engines`), then replays one multi-turn GRPO
workload (:mod:`rollbank_bench.routing_workload`) per arm: each rollbank policy
(round_robin, least_loaded, sticky, cache_aware) routing in-process, then ``vllm-router``
(PyPI, Rust) placed in front of the same servers with its cache_aware, consistent_hash and
sticky_least_loaded policies. ``--repeats`` rounds (default 3), the arm order rotated each
round; every number is the median over rounds (:mod:`rollbank_bench.routing_report`). Before
each arm every server's prefix cache is reset, so arms start equal; observations and pauses
are seeded and identical per arm. Every arm sends the same ``/v1/completions`` body.

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
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from rollbank_bench.routing_engines import ENGINES
from rollbank_bench.routing_report import merge_rounds, merge_runs, move_diagnosis, summarize

DEFAULT_POLICIES = "round_robin,least_loaded,sticky,cache_aware"
DEFAULT_PEERS = (
    "cache_aware,consistent_hash:trajectory,consistent_hash:group,"
    "sticky_least_loaded:trajectory,sticky_least_loaded:group"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--json", action="store_true", help="print one JSON object (the default output anyway)")
    a("--quick", action="store_true", help="small workload (4 groups x 2, 3 turns) for a fast run")
    a("--engine", choices=ENGINES, default="vllm",
      help="vllm: real vLLM servers; accel-sim: emulated accelerator engines (--profile)")
    a("--model", default="tiny", help="vllm: model served by every server (default: tiny)")
    a("--profile", default="h100-llama3.1-8b", help="accel-sim: latency profile name or path")
    a("--servers", type=int, default=None, help="number of engines (>= 2; vllm 2, accel-sim 4)")
    a("--groups", type=int, default=None, help="GRPO groups (vllm 8, accel-sim 16)")
    a("--group-size", type=int, default=None, help="siblings per group (vllm 4, accel-sim 8)")
    a("--turns", type=int, default=6, help="turns per conversation")
    a("--header-tokens", type=int, default=None,
      help="prompt header shared by every group (vllm 128, accel-sim 256)")
    a("--task-tokens", type=int, default=None,
      help="per-group task tokens, shared by siblings (vllm 256, accel-sim 1024)")
    a("--obs-tokens", default=None,
      help="observation length range per turn, 'min,max' (vllm 48,160; accel-sim 100,400)")
    a("--max-tokens", type=int, default=None, help="tokens generated per turn (vllm 32, accel-sim 128)")
    a("--tool-pause", type=float, default=None,
      help="max seeded pause between turns, s (vllm 0.3, accel-sim 1.0)")
    a("--block-size", type=int, default=32,
      help="vllm: KV block size and router block size (accel-sim: the profile's)")
    a("--balance-abs", type=int, default=None,
      help="cache-aware absolute imbalance threshold (default: RouterConfig's), also the peer's")
    a("--balance-rel", type=float, default=None,
      help="cache-aware relative imbalance threshold (default: RouterConfig's), also the peer's")
    a("--router-config", default="",
      help="extra RouterConfig fields for rollbank's cache_aware arm, 'key=value,...'")
    a("--policies", default=DEFAULT_POLICIES,
      help="rollbank policies to run, comma-separated; 'policy+key=value+...' is a variant "
      "with RouterConfig overrides (e.g. cache_aware+session_idle_s=0)")
    a("--peers", default=DEFAULT_PEERS,
      help="peer router arms '[vllm-router/|sglang-router/]policy[:trajectory|group]', "
      "comma-separated (router defaults to vllm-router); '' for none")
    a("--seed", type=int, default=0, help="workload seed")
    a("--temperature", type=float, default=1.0, help="sampling temperature (0: greedy)")
    a("--kv-cache-gib", type=float, default=1.0, help="vllm: VLLM_CPU_KVCACHE_SPACE per server")
    a("--repeats", type=int, default=3, help="rounds over all arms (order rotated); medians")
    a("--out", type=Path, default=None, help="also write the JSON object to this file")
    a("--merge", type=Path, nargs="+", default=None, metavar="JSON",
      help="run nothing: pool the rounds of these earlier runs' JSON (same engine and "
      "workload) and judge the targets over all of them")
    a("--timeline", type=Path, default=None,
      help="write every arm-round's per-request timeline and queue depth (JSON lines) here")


ENGINE_DEFAULTS: dict[str, dict[str, Any]] = {
    "vllm": {"servers": 2, "groups": 8, "group_size": 4, "header_tokens": 128,
             "task_tokens": 256, "obs_tokens": "48,160", "max_tokens": 32, "tool_pause": 0.3},
    "accel-sim": {"servers": 4, "groups": 16, "group_size": 8, "header_tokens": 256,
                  "task_tokens": 1024, "obs_tokens": "100,400", "max_tokens": 128,
                  "tool_pause": 1.0},
}


def apply_defaults(args: argparse.Namespace) -> None:
    """Fill every workload option left unset with the engine's default (then ``--quick``)."""
    for key, value in ENGINE_DEFAULTS[args.engine].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.quick:
        args.groups, args.group_size, args.turns = 4, 2, 3


def policy_variant(spec: str) -> tuple[str, dict[str, Any]]:
    """``'cache_aware+session_idle_s=0'`` -> ``("cache_aware", {"session_idle_s": 0})``: an arm
    of a policy with RouterConfig overrides (an ablation in the same rotated rounds)."""
    policy, *items = spec.split("+")
    return policy, parse_router_config(",".join(items))


def parse_router_config(text: str) -> dict[str, Any]:
    """``'a=1,b=0.5,c=x'`` -> ``{"a": 1, "b": 0.5, "c": "x"}`` (RouterConfig validates)."""
    out: dict[str, Any] = {}
    for item in (t for t in text.split(",") if t.strip()):
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--router-config item {item!r} is not key=value")
        value: Any = raw.strip()
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                continue
        out[key.strip()] = value
    return out


def merged_report(paths: Sequence[Path]) -> dict[str, Any]:
    """``--merge``: the runs' rounds pooled per arm (:func:`merge_runs`) and judged again.
    Runs of another engine, model or workload than the first are refused (ValueError)."""
    runs = [json.loads(p.read_text()) for p in paths]
    first = runs[0]
    for path, r in zip(paths, runs, strict=True):
        if r.get("bench") != "routing":
            raise ValueError(f"{path}: not a `rollbank bench routing` JSON (bench={r.get('bench')!r})")
        for key in ("engine", "model", "profile", "servers", "workload"):
            if r.get(key) != first.get(key):
                raise ValueError(f"{path}: {key} differs from {paths[0]}'s; only runs of one "
                                 "workload on one fleet can be pooled")
    arms = merge_runs(runs)
    return {
        "bench": "routing", "merged_from": [str(p) for p in paths],
        **{k: first[k] for k in ("engine", "model", "profile", "servers", "workload") if k in first},
        "repeats": sum(int(r.get("repeats", 0)) for r in runs),
        "runs": [{"file": str(p), "repeats": r.get("repeats"), "host": r.get("host"),
                  "summary": r.get("summary")} for p, r in zip(paths, runs, strict=True)],
        "sources": {**first.get("sources", {}),
                    "medians": "every round of every run pooled per arm: round fields are the "
                               "median over all rounds, other numbers the median of the runs' "
                               "medians weighted by their rounds"},
        "arms": arms,
        "summary": summarize(arms),
    }


def run(args: argparse.Namespace) -> int:
    import asyncio

    if args.merge:
        try:
            report = merged_report(args.merge)
        except (OSError, ValueError, KeyError) as exc:
            print(f"bench routing --merge: {exc}", file=sys.stderr)
            return 3
    else:
        apply_defaults(args)
        if args.servers < 2:
            print("bench routing needs --servers >= 2", file=sys.stderr)
            return 2
        report = asyncio.run(_main(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    # a pooled report judges earlier runs: their arms' errors were theirs, not this command's
    return 1 if not args.merge and any("error" in arm for arm in report["arms"]) else 0


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    import os

    import httpx

    from rollbank.clock import MonotonicClock
    from rollbank.inference.protocol import GenerateRequest, SamplingParams
    from rollbank.routing.cache_aware import CacheAwareRouter
    from rollbank.routing.config import RouterConfig
    from rollbank.routing.factory import make_router
    from rollbank_bench.routing_engines import open_fleet
    from rollbank_bench.routing_peers import (
        PEER_ROUTERS,
        PeerRouter,
        bench_clients,
        find_router,
        peer_client,
    )
    from rollbank_bench.routing_workload import (
        ArmResult,
        Workload,
        fixed_dispatch,
        router_dispatch,
        run_arm,
    )

    defaults = RouterConfig()
    if args.balance_abs is None:
        args.balance_abs = defaults.balance_abs_threshold
    if args.balance_rel is None:
        args.balance_rel = defaults.balance_rel_threshold
    extra_cfg = parse_router_config(args.router_config)
    lo_obs, hi_obs = (int(x) for x in args.obs_tokens.split(","))
    load_before = os.getloadavg()
    async with open_fleet(args) as fleet:
        urls, block = fleet.urls, fleet.block_size
        workload = Workload(
            groups=args.groups, group_size=args.group_size, turns=args.turns,
            header_tokens=args.header_tokens, task_tokens=args.task_tokens,
            obs_tokens=(lo_obs, hi_obs), max_tokens=args.max_tokens, tool_pause_s=args.tool_pause,
            vocab=fleet.vocab, seed=args.seed, temperature=args.temperature,
        )
        # warm each engine once (first-request compilation), outside every arm
        async with bench_clients(urls) as warm:
            for i, c in enumerate(warm.values()):
                await c.generate(GenerateRequest(f"warmup-{i}", list(range(16, 80)), SamplingParams(
                    max_tokens=4, temperature=0.0, logprobs=False)))

        async def reset() -> None:
            for c in fleet.clients:
                await c.reset_prefix_cache()

        async def rollbank_arm(spec: str) -> ArmResult:
            policy, variant = policy_variant(spec)
            cfg: dict[str, Any] = dict(block_size=block, balance_abs_threshold=args.balance_abs,
                                       balance_rel_threshold=args.balance_rel)
            if policy == "cache_aware":
                cfg.update(extra_cfg)
            cfg.update(variant)
            router = make_router(policy, urls, MonotonicClock(), **cfg)
            # fresh connections per arm, as every peer arm gets (a new router process and
            # client): a burst on connections pooled by the previous arm was measured slower
            # to send on this host than one on new connections
            async with bench_clients(urls) as clients:
                dispatch, finish = router_dispatch(router, clients)
                res = await run_arm(ArmResult(f"rollbank:{spec}", "rollbank"), workload, urls,
                                    dispatch, finish)
            if isinstance(router, CacheAwareRouter):
                res.extra["router_decisions"] = {
                    k: v for k, v in router.stats().items() if k.startswith("reason_")
                }
            res.extra["affinity_move_detail"] = move_diagnosis(res.records, urls, args.turns)
            return res

        async def peer_arm(name: str, router_name: str, policy: str, by: str) -> ArmResult:
            res = ArmResult(name, "peer")
            extra = (["--cache-threshold", "0.3", "--balance-abs-threshold", str(args.balance_abs),
                      "--balance-rel-threshold", str(args.balance_rel)]
                     if policy == "cache_aware" else [])
            binary = find_router(router_name)
            if binary is None:
                res.error = f"{router_name} not installed (pip install 'rollbank[peers]')"
                return res
            try:
                async with PeerRouter(binary, urls, policy, extra) as peer:
                    client = peer_client(peer.url, fleet.served_name, by)
                    try:
                        await run_arm(res, workload, urls, *fixed_dispatch(client))
                    finally:
                        await client.aclose()
            except (OSError, TimeoutError, httpx.HTTPError, RuntimeError) as exc:
                res.error = f"peer router failed: {exc!r}"
            return res

        specs: list[tuple[str, Callable[[], Awaitable[ArmResult]]]] = [
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
        timeline = args.timeline.open("w") if args.timeline is not None else None
        try:
            rounds: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in specs}
            for r in range(args.repeats):
                k = r % len(specs)  # rotate the order each round so no arm always runs first
                for pos, (name, fn) in enumerate(specs[k:] + specs[:k]):
                    await reset()
                    res = await fn()
                    summary = res.summary(urls, block)
                    summary["order"] = pos
                    summary["load_avg_1m"] = round(os.getloadavg()[0], 2)
                    rounds[name].append(summary)
                    if timeline is not None:
                        timeline.write(json.dumps({"round": r, "order": pos,
                                                   **res.timeline(urls)}) + "\n")
            arms = [merge_rounds(rounds[name]) for name, _ in specs]
        finally:
            if timeline is not None:
                timeline.close()

    return {
        "bench": "routing",
        "engine": fleet.engine,
        "model" if fleet.engine == "vllm" else "profile": fleet.label,
        "servers": args.servers,
        "workload": {
            "groups": args.groups, "group_size": args.group_size, "turns": args.turns,
            "conversations": args.groups * args.group_size,
            "header_tokens": args.header_tokens, "task_tokens": args.task_tokens,
            "obs_tokens": [lo_obs, hi_obs], "max_tokens": args.max_tokens,
            "tool_pause_s": args.tool_pause, "block_size": block, "seed": args.seed,
            "balance_abs": args.balance_abs, "balance_rel": args.balance_rel,
            "temperature": args.temperature, "cache_aware_config": extra_cfg,
        },
        "host": {"load_avg_before": [round(x, 2) for x in load_before],
                 "load_avg_after": [round(x, 2) for x in os.getloadavg()],
                 "cpus": os.cpu_count()},
        "sources": {
            "uncached_and_repeated": "per request: usage.prompt_tokens_details.cached_tokens",
            "hit_rate": "/metrics deltas: vllm:prefix_cache_hits / vllm:prefix_cache_queries",
            "inflight": "/metrics running+waiting sampled every 0.25 s per server",
            "wall_s": "client: first request sent to last answer received",
            "ttft": "client-measured, no streaming: per request the client's round trip (send "
                    "to answer) minus the engine's own first-token-to-last-token interval "
                    "(metrics.generation_time_ms); p50/p95 nearest rank over the arm's requests",
            "engine_queue": "engine: metrics.queue_time_ms (arrival to scheduled)",
            "engine_ttft": "engine: queue_time_ms + time_to_first_token_ms (arrival at the "
                           "engine to first token; no client, proxy or host-scheduling lag)",
            "affinity_move_detail": "rollbank arms, per round: each turn that left its "
                                    "conversation's server, with requests in flight and live "
                                    "conversations per server at that moment",
            "medians": "every number of an arm is the median over rounds; 'rounds' keeps the "
                       "key fields per round and the arm's position in the rotated order",
        },
        "repeats": args.repeats,
        "arms": arms,
        "summary": summarize(arms),
    }
