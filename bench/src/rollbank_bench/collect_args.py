"""`rollbank bench collect`'s command line and per-arm configuration (split from
:mod:`rollbank_bench.collect` by role).

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

LEVERS = ("routing", "sandboxes", "ready_bank", "overprovision")


def _levers(*on: str) -> dict[str, bool]:
    return {lv: lv in on for lv in LEVERS}


ARMS: dict[str, dict[str, bool]] = {
    "naive": _levers(),
    "routing": _levers("routing"),
    "sandboxes": _levers("sandboxes"),
    "bank": _levers("ready_bank", "overprovision"),  # the ready bank with its G' > G
    "optimized": _levers(*LEVERS),
    "naive_rebuild": _levers(),
    # the per-lever ablation (--arms ablation): each of the bank's two halves alone, and each
    # lever removed from all
    "ready_bank": _levers("ready_bank"),  # carry + slot retries, G' = G
    "overprovision": _levers("overprovision"),  # G' > G, first G complete, the rest aborted
    **{f"all_but_{lv}": _levers(*(x for x in LEVERS if x != lv)) for lv in LEVERS},
}
REBUILD_ARMS = frozenset({"naive_rebuild"})  # cold start = layers rebuilt per episode
DEFAULT_ARMS = ("naive", "routing", "sandboxes", "bank", "optimized")
DEFAULT_TASKS = ["terminal-lite"]
# interleaved: single levers and lever removals alternate, naive first and in the middle
ABLATION_ARMS = ("naive", "optimized", "sandboxes", "all_but_sandboxes", "routing",
                 "all_but_routing", "naive", "ready_bank", "all_but_ready_bank", "overprovision",
                 "all_but_overprovision")


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
    a("--harness", choices=("fenced-shell", "chat", "agent"), default=None,
      help="model workload: the harness (default: the collector's); agent: an unmodified "
      "agent program through the gateway (--agent-entry)")
    a("--agent-entry", default=None, metavar="MODULE:FUNCTION",
      help="--harness agent: the agent program (default: mini-swe-agent, docs/agents.md)")
    a("--agent-step-limit", type=int, default=None,
      help="--harness agent: the agent's own step limit (agent.options.step_limit)")
    add_trace_argument(parser)
    a("--max-turns", type=int, default=3, help="model workload: model turns per episode")
    a("--max-tokens", type=int, default=48, help="model workload: tokens per model turn")
    a("--step-timeout", type=float, default=30.0, help="per-command timeout (s)")
    a("--verifier-slots", type=int, default=None,
      help="verifiers at once (every arm; default: the CPU count)")
    a("--tasks", nargs="+", default=DEFAULT_TASKS, help="task folders or suites")
    a("--exclude-costs", default="expensive-env",
      help="comma-separated task costs left out (default: expensive-env; see module notes)")
    a("--arms", default=",".join(DEFAULT_ARMS),
      help=f"arms to run, comma-separated, in this order (of: {', '.join(ARMS)}); 'ablation': "
      f"{','.join(ABLATION_ARMS)} (a repeated name runs again: the second is reported as "
      "NAME#2)")
    a("--include", default=None,
      help="comma-separated task ids to collect (default: with the default --tasks, the embedded "
      "collect default's include, the tasks every earlier measurement ran; with your own "
      "--tasks, all of them; '' = every task of --tasks left by --exclude-costs)")
    a("--seed", type=int, default=0, help="scheduler and task-order seed")
    a("--block-size", type=int, default=32, help="vLLM KV block size = router block size")
    a("--kv-cache-gib", type=float, default=2.0, help="VLLM_CPU_KVCACHE_SPACE per server")
    a("--out", type=Path, default=Path("runs/bench-collect"), help="per-arm outputs go here")
    a("--engine", choices=("vllm", "accel-sim"), default="vllm",
      help="vllm: managed real vLLM servers (the CPU regime); accel-sim: --num-servers accelsim "
      "benchmark engine processes (rollbank_bench.accelsim: vLLM's HTTP API, accelerator wall "
      "time, ~no CPU) used as external servers, tokens decoded with --model's tokenizer")
    a("--hold-extras-for-verifier", choices=("auto", "on", "off"), default="auto",
      help="bank arms: does a waiting verifier hold extra groups back "
      "(scheduler.hold_extras_for_verifier)? auto: off with accel-sim, on with vllm")
    a("--accelsim-profile", default="h100-llama3.1-8b",
      help="accelsim latency profile (name or TOML path) for --engine accel-sim")


def add_trace_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--trace-profile", default=None, metavar="NAME",
        help="an agent-shaped trace (rollbank_bench.traces, a benchmark instrument: turns, "
        "tokens, tool output and latency from published agent statistics, shrunk by "
        "--token-scale/--turn-scale/--time-scale); sets the workload fields (--trace still "
        "overrides) and, with accel-sim, the engine's token and time scales")
    parser.add_argument("--token-scale", type=int, default=None,
                        help="trace profile: modelled tokens per wire token (default: the profile's)")
    parser.add_argument("--turn-scale", type=int, default=None,
                        help="trace profile: agent turns per scripted turn (default: the profile's)")
    parser.add_argument("--time-scale", type=float, default=None,
                        help="trace profile: time compression of engine steps and tool sleeps "
                        "(default: the profile's)")
    parser.add_argument(
        "--trace", action="append", default=[], metavar="FIELD=VALUE",
        help="override a trace workload field (rollbank.episodes.workload.WorkloadConfig), "
        "e.g. --trace turns_median=6 --trace tool_latency_median_s=2; repeatable")


def agent_trace(args: argparse.Namespace) -> Any:
    """The ``--trace-profile`` (with the command line's scales), or None."""
    name = getattr(args, "trace_profile", None)
    if not name:
        return None
    from rollbank_bench.traces import get_trace

    return get_trace(name).with_scales(token_scale=getattr(args, "token_scale", None),
                                       turn_scale=getattr(args, "turn_scale", None),
                                       time_scale=getattr(args, "time_scale", None))


def trace_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The trace profile's workload fields, then ``--trace FIELD=VALUE`` pairs (later ones
    win); the config validates names and values."""
    trace = agent_trace(args)
    out: dict[str, Any] = {} if trace is None else {
        k: v for k, v in trace.workload_fields().items() if k != "kind"}
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

    lv = ARMS[arm.split("#")[0]]
    trace = agent_trace(args)
    context = 2048 if args.workload != "trace" else (
        4096 if trace is None else trace.max_model_len)
    optimized = lv["ready_bank"] or lv["overprovision"]
    # the ready bank: complete groups banked across batches, stragglers carried, infra-failed
    # siblings re-run in their slot; over-provisioning alone: G' groups, the first G complete
    # make the batch and the open ones are aborted (slime-style over-sampling)
    straggler = "carry" if lv["ready_bank"] else ("abort" if lv["overprovision"] else "wait")
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
        "runner.max_model_len": context,
        # the servers must serve that context (found by the config's cross-check: the trace
        # arms let the runner build prompts up to 4096 tokens for 2048-token servers)
        "inference.managed.max_model_len": context,
        "workload.kind": args.workload,
        "scheduler.mode": "optimized" if optimized else "naive",
        "scheduler.groups_per_batch": args.groups,
        "scheduler.pool_groups": bank_lever(args)[0] if lv["overprovision"] else args.groups,
        "scheduler.max_groups": bank_lever(args)[1] if optimized else None,
        "scheduler.straggler": straggler,
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
    harness = getattr(args, "harness", None)
    if harness is not None:
        if args.workload != "model":
            from rollbank.errors import UsageError

            raise UsageError(f"--harness {harness} needs --workload model (a trace scripts "
                             "the episodes: no harness speaks)")
        o["harness"] = harness
        if harness == "agent" and args.agent_entry:
            o["agent.entry"] = args.agent_entry
        if harness == "agent" and args.agent_step_limit is not None:
            o["agent.options"] = {"step_limit": args.agent_step_limit}
    if not lv["ready_bank"]:
        o["scheduler.bank.max_retries"] = 0  # slot retries are the bank's
    if args.include is not None:
        o["include"] = [t for t in args.include.split(",") if t]
    elif list(args.tasks) == DEFAULT_TASKS:
        # named tasks replace the embedded default's include (task_selection), and the bench
        # always names them: keep the default's selection, the workload of every earlier run
        o["include"] = list(load_collect_config(None, {}).include)
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
    if arms == ["ablation"]:
        arms = list(ABLATION_ARMS)
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms:
        raise UsageError(f"--arms {text}: unknown arm(s) {', '.join(unknown) or '(none given)'}; "
                         f"choose from {', '.join(ARMS)} or 'ablation'")
    seen: dict[str, int] = {}
    out = []
    for a in arms:  # a repeated arm runs again under NAME#2, NAME#3, ...
        seen[a] = seen.get(a, 0) + 1
        out.append(a if seen[a] == 1 else f"{a}#{seen[a]}")
    return out
