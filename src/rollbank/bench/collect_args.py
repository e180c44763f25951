"""`rollbank bench collect`'s command line and per-arm configuration (split from
:mod:`rollbank.bench.collect` by role).

Owns the arms and their levers (:data:`ARMS`), the arguments (:func:`add_arguments`), the
resolved collect configuration of one arm (:func:`arm_config`: same capacity, seeds, tasks and
episode limits for every arm; only the levers differ) and the bank lever's G' and launch cap
(:func:`bank_lever`). With ``--engine accel-sim`` the bank arms do not hold extra groups back
for a waiting verifier (``scheduler.hold_extras_for_verifier``; see :func:`holds_for_verifier`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

ARMS: dict[str, dict[str, bool]] = {
    "naive": {"routing": False, "sandboxes": False, "bank": False},
    "routing": {"routing": True, "sandboxes": False, "bank": False},
    "sandboxes": {"routing": False, "sandboxes": True, "bank": False},
    "bank": {"routing": False, "sandboxes": False, "bank": True},
    "optimized": {"routing": True, "sandboxes": True, "bank": True},
    "naive_rebuild": {"routing": False, "sandboxes": False, "bank": False},
}
REBUILD_ARMS = frozenset({"naive_rebuild"})  # cold start = layers rebuilt per episode
DEFAULT_ARMS = tuple(a for a in ARMS if a not in REBUILD_ARMS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--json", action="store_true", help="print one JSON object (the default output anyway)")
    a("--quick", action="store_true",
      help="CI smoke size: 4 groups x 4, pool 6, tiny model, cheap tasks, 2 turns")
    a("--model", default="tiny", help="served model: 'tiny', 'gemma-3-270m' or a folder")
    a("--num-servers", type=int, default=2, help="managed vLLM servers (same for every arm)")
    a("--groups", type=int, default=32, help="G: complete groups per batch")
    a("--group-size", type=int, default=8, help="n: siblings per group")
    a("--pool-groups", type=int, default=None,
      help="G' for the over-provisioning lever (default: 48 with --engine vllm, 2 G with "
      "accel-sim)")
    a("--spare-groups", type=int, default=None,
      help="bank lever: launch at most batches x G + this many groups (scheduler.max_groups; "
      "-1: no cap). Default: ceil(G/4) with --engine accel-sim (chosen with `bench schedule "
      "--from-measured --sweep`), no cap with vllm")
    a("--batches", type=int, default=2, help="batches per arm (the measurement window)")
    a("--repeats", type=int, default=1,
      help="run the arm list this many times, the order rotated each repeat (two arms, 2 "
      "repeats: naive, optimized, optimized, naive); each arm is paired with the same "
      "repeat's naive arm and the host load each arm saw is reported (bench/collect_compare.py)")
    a("--sandbox-slots", type=int, default=256, help="sandboxes at once (every arm)")
    a("--inference-slots", type=int, default=32, help="requests in flight per server (every arm)")
    a("--workload", choices=("trace", "model"), default="trace",
      help="trace: seeded Terminal-Bench-shaped episodes (turns, tokens, tool latency; see "
      "rollbank.episodes.workload); model: the model's own actions (the tiny model's are "
      "uniform: no tail)")
    add_trace_argument(parser)
    a("--max-turns", type=int, default=3, help="model workload: model turns per episode")
    a("--max-tokens", type=int, default=48, help="model workload: tokens per model turn")
    a("--step-timeout", type=float, default=30.0, help="per-command timeout (s)")
    a("--verifier-slots", type=int, default=None,
      help="verifiers at once (every arm; default: the CPU count)")
    a("--tasks", nargs="+", default=["terminal-lite"], help="task folders or suites")
    a("--exclude-costs", default="expensive-env",
      help="comma-separated task costs left out (default: expensive-env; see module notes)")
    a("--arms", default=",".join(DEFAULT_ARMS),
      help=f"arms to run, comma-separated, in this order (of: {', '.join(ARMS)})")
    a("--seed", type=int, default=0, help="scheduler and task-order seed")
    a("--block-size", type=int, default=32, help="vLLM KV block size = router block size")
    a("--kv-cache-gib", type=float, default=2.0, help="VLLM_CPU_KVCACHE_SPACE per server")
    a("--out", type=Path, default=Path("runs/bench-collect"), help="per-arm outputs go here")
    a("--engine", choices=("vllm", "accel-sim"), default="vllm",
      help="vllm: managed real vLLM servers (the CPU regime); accel-sim: --num-servers accelsim "
      "benchmark engine processes (rollbank.bench.accelsim: vLLM's HTTP API, accelerator wall "
      "time, ~no CPU) used as external servers, tokens decoded with --model's tokenizer")
    a("--hold-extras-for-verifier", choices=("auto", "on", "off"), default="auto",
      help="bank arms: does a waiting verifier hold extra groups back "
      "(scheduler.hold_extras_for_verifier)? auto: off with accel-sim, on with vllm")
    a("--accelsim-profile", default="h100-llama3.1-8b",
      help="accelsim latency profile (name or TOML path) for --engine accel-sim")


def add_trace_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace", action="append", default=[], metavar="FIELD=VALUE",
        help="override a trace workload field (rollbank.episodes.workload.WorkloadConfig), "
        "e.g. --trace turns_median=6 --trace tool_latency_median_s=2; repeatable")


def trace_overrides(args: argparse.Namespace) -> dict[str, str]:
    """``--trace FIELD=VALUE`` pairs (later ones win); the config validates names and values."""
    out: dict[str, str] = {}
    for item in args.trace:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise SystemExit(f"--trace {item!r}: expected FIELD=VALUE")
        out[name.strip()] = value.strip()
    return out


def _quick(args: argparse.Namespace) -> None:
    args.groups, args.group_size, args.pool_groups = 4, 4, 6
    args.max_turns, args.max_tokens, args.batches = 2, 32, 1
    args.sandbox_slots, args.inference_slots = 16, 16
    args.exclude_costs = "expensive-env,long-running"
    args.trace = ["turns_median=3", "tool_latency_median_s=0.3", *args.trace]


def arm_config(args: argparse.Namespace, arm: str, output: Path | None = None) -> Any:
    from rollbank.collect_config import load_collect_config

    lv = ARMS[arm]
    o: dict[str, Any] = {
        "tasks": args.tasks,
        "exclude_costs": [c for c in args.exclude_costs.split(",") if c],
        "task_order_seed": args.seed,
        "output": str(output or args.out / arm),
        # arms compare time to a batch of G groups: no arm holds zero-variance groups back
        "scheduler.bank.dynamic_sampling.enabled": False,
        "runner.max_turns": args.max_turns,
        "fenced_shell.max_tokens": args.max_tokens,
        "runner.step_timeout_s": args.step_timeout,
        "runner.verifier_slots": args.verifier_slots,
        "runner.max_model_len": 4096 if args.workload == "trace" else 2048,
        # the servers must serve that context (found by the config's cross-check: the trace
        # arms let the runner build prompts up to 4096 tokens for 2048-token servers)
        "inference.managed.max_model_len": 4096 if args.workload == "trace" else 2048,
        "workload.kind": args.workload,
        "scheduler.mode": "optimized" if lv["bank"] else "naive",
        "scheduler.groups_per_batch": args.groups,
        "scheduler.pool_groups": bank_lever(args)[0] if lv["bank"] else args.groups,
        "scheduler.max_groups": bank_lever(args)[1] if lv["bank"] else None,
        "scheduler.straggler": "carry" if lv["bank"] else "wait",
        "scheduler.hold_extras_for_verifier": holds_for_verifier(args),
        "scheduler.sandbox_slots": args.sandbox_slots,
        "scheduler.inference_slots_per_server": args.inference_slots,
        "scheduler.num_batches": args.batches,
        "scheduler.seed": args.seed,
        "scheduler.bank.group_size": args.group_size,
        "router.policy": "cache_aware" if lv["routing"] else "round_robin",
        "router.block_size": args.block_size,
        "sandbox.warm": lv["sandboxes"],
        "sandbox.cold_rebuild": arm in REBUILD_ARMS,
        "inference.calibrate": False,
        "inference.managed.model": args.model,
        "inference.managed.num_servers": args.num_servers,
        "inference.managed.block_size": args.block_size,
        "inference.managed.kv_cache_gib": args.kv_cache_gib,
        "metrics.live": "off",
        "metrics.record_episodes": True,
    }
    if getattr(args, "engine_urls", None):  # --engine accel-sim: the emulators, as external servers
        o.update({"inference.kind": "external", "inference.urls": args.engine_urls,
                  "inference.tokenizer": args.model})
    if args.workload == "trace":
        # episodes run to their plan or the task's own agent timeout (the embedded default's
        # episode budget is for the Gemma main job)
        o["runner.episode_budget_s"] = None
    o.update({f"workload.{k}": v for k, v in trace_overrides(args).items()})
    return load_collect_config(None, o)


def holds_for_verifier(args: argparse.Namespace) -> bool:
    """``scheduler.hold_extras_for_verifier`` of every arm (only the bank arms have extras).
    Default off with accel-sim: there the extras' episodes barely use the host's CPU (their
    inference is emulated, their tools sleep), so holding them back while a verifier waits only
    delays them; the verifier queue orders the verifications by group completion. Simulated on
    the quiet 8 x 8 run's inputs at 32 x 8 x 3 (G' 80, cap 112): the same 0.32x naive at the
    quiet verifier cost, 0.39x instead of 0.46x at twice it, 0.56x instead of 0.64x at three
    times (docs/collect.md). On with vLLM CPU, where extras slowed the verifiers (measured)."""
    mode = getattr(args, "hold_extras_for_verifier", "auto")
    if mode == "auto":
        return getattr(args, "engine", "vllm") != "accel-sim"
    return bool(mode == "on")


def bank_lever(args: argparse.Namespace) -> tuple[int, int | None]:
    """(G', launch cap) of the bank arms. With accel-sim by default G' = 2 G and at most the
    window's groups plus ceil(G/4) spare ones launched (``scheduler.max_groups``). Simulated on
    the measured inputs of two runs (docs/measurements/schedule-from-measured-*-simfit.json):
    quiet host, median over 8 seeds 0.46x naive with 11% of launched attempts (15% of
    sandbox-seconds) wasted, against 0.58x and 20% (23%) for the old G' = 1.5 G uncapped;
    launching the whole capped window at once (G' = cap) was faster there (0.42x) but on the
    loaded, verifier-bound run it launched every group before the contention that holds
    extras back showed, wasting 19% of sandbox-seconds for no gain (0.4% with G' = 2 G)."""
    accel = getattr(args, "engine", "vllm") == "accel-sim"
    spare = args.spare_groups
    if spare is None:
        spare = -(-args.groups // 4) if accel else -1
    cap = args.batches * args.groups + spare if spare >= 0 else None
    pool = args.pool_groups
    if pool is None:
        pool = min(2 * args.groups, cap) if accel and cap is not None else 48
    return max(pool, args.groups), cap


def parse_arms(text: str) -> list[str]:
    """``--arms a,b,c`` in order; an unknown name is a usage error naming it."""
    from rollbank.errors import UsageError

    arms = [a.strip() for a in text.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise UsageError(f"--arms {text}: unknown arm(s) {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(ARMS)}")
    return arms
