"""`rollbank bench collect`: fixed-weight time to a trainable batch, naive vs optimized (JSON).

One set of managed vLLM servers (same weights, same capacity) serves every arm in turn; the
prefix caches are reset before each arm. Every arm runs the same task sequence with the same
seeds, the same sandbox slots and inference slots per server. Arms:

- ``naive``: launch-order synchronous batch (scheduler mode ``naive``: exactly G groups, wait
  for all), round-robin routing, a fresh sandbox per episode started from the task's cached
  layers (what ``docker run`` of an image built once does; its measured start cost is reported
  per arm as ``sandbox_setup_s``), no over-provisioning.
- ``routing``: naive + cache-aware routing.
- ``sandboxes``: naive + warm snapshot/fork sandboxes.
- ``bank``: naive + ready bank (G' > G over-provisioning, straggler policy ``carry``, infra
  retries in the sibling slot; with accel-sim by default G' = 2 G and no more than the
  window's groups plus ceil(G/4) spare ones launched, see :func:`bank_lever`).
- ``optimized``: all three levers.
- ``naive_rebuild`` (only when asked for with ``--arms``): naive with the environment layers
  rebuilt in a private cache per episode (a ``docker build`` per episode), a separately
  labelled variant; the ratios are always against ``naive``.

``--engine accel-sim`` swaps the managed vLLM servers for ``--num-servers`` accelsim
benchmark engine processes (:mod:`rollbank_bench.accelsim`: vLLM's HTTP API answering after an
accelerator's wall time from a latency profile, almost no CPU), reached as external servers:
the accelerator regime. Everything else (sandboxes, verifiers, router, scheduler) stays real.

The time of an arm is from its first launch until ``--batches`` batches of G complete groups
are handed over, divided by the number of batches (the multi-batch window); over-provisioned
work still running or unconsumed when the window closes is counted as waste (sandbox-slot
seconds), never hidden. Each arm also carries ``sim_inputs`` (its measured per-attempt costs,
task sequence, budgets and scheduler config) for ``rollbank bench schedule --from-measured``.
``--repeats N`` runs the arm list N times, the order rotated each repeat (ABBA for two arms),
and pairs each arm with its repeat's naive arm, with the host load each saw
(:mod:`rollbank_bench.collect_compare`): arms run one after the other on a shared host
otherwise measure the host's load. Each arm reports its lower bound T_LB (same calibrated capacity),
efficiency T_LB/T, tail share, outcomes, waste and the accepted-vs-pool profile.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollbank_bench import collect_compare as cmp
from rollbank_bench.collect_args import (  # re-exported: the command's public names
    ARMS,
    DEFAULT_ARMS,
    REBUILD_ARMS,
    _quick,
    add_arguments,
    add_trace_argument,
    agent_trace,
    arm_config,
    bank_lever,
    parse_arms,
    trace_overrides,
)

__all__ = ["ARMS", "DEFAULT_ARMS", "REBUILD_ARMS", "_quick", "add_arguments",
           "add_trace_argument", "arm_config", "bank_lever", "busy_share", "episode_shape",
           "parse_arms", "run", "trace_overrides", "verifier_wait_s", "waste_from_events"]

if TYPE_CHECKING:
    from rollbank.episodes.trajectory import Trajectory


def busy_share(busy_s: Sequence[float], batch_s: Sequence[float],
               servers: int) -> list[float | None]:
    """Per batch, the share of the engines' time spent generating: busy server-seconds over
    the batch's wall time on every server (1.0: every engine busy the whole batch)."""
    return [round(b / (t * servers), 3) if t > 0 and servers > 0 else None
            for b, t in zip(busy_s, batch_s, strict=True)]


def verifier_wait_s(trajs: Sequence[Trajectory]) -> float:
    """Seconds finished episodes waited for a verifier slot, summed: from the end of an
    episode's last sandbox or inference span to its verifier's start
    (:func:`~rollbank_bench.sim_inputs.around_verifier`)."""
    from rollbank.episodes.spans import SPANS_KEY
    from rollbank_bench.sim_inputs import around_verifier

    total = 0.0
    for t in trajs:
        split = around_verifier(t.meta.get(SPANS_KEY, []), t.finished_at or 0.0)
        if split is not None:
            total += max(0.0, split[1] - split[0])
    return total


def _arm_report(result: Any, setup_s: float, servers: int) -> dict[str, Any]:
    bs = result.batches
    n = max(len(bs), 1)
    acct = [b.extra.get("accounting", {}) for b in bs]
    waste = waste_from_events(result.out_dir / "events.jsonl")
    waste_s = waste["sandbox_s"]
    consumed_s = sum(a.get("consumed_s", 0.0) for a in acct)
    lb = [b.lower_bound for b in bs]
    return {
        "time_per_batch_s": result.collection_s / n,
        "batch_times_s": [b.time_to_batch_s for b in bs],
        "t_lb_s": statistics.fmean(x.get("t_lb_s", 0.0) for x in lb) if lb else None,
        "lower_bound_terms": lb,
        "efficiency": statistics.fmean(b.efficiency for b in bs if b.efficiency is not None)
        if any(b.efficiency is not None for b in bs) else None,
        "tail_share": [round(b.tail_share, 3) for b in bs],
        "tokens_per_s": [round(b.tokens_per_s, 1) for b in bs],
        "prefix_cache_hit_rate": [b.prefix_cache_hit_rate for b in bs],
        "inference_busy_s": [round(b.inference_busy_s, 1) for b in bs],
        "inference_busy_share": busy_share([b.inference_busy_s for b in bs],
                                           [b.time_to_batch_s for b in bs], servers),
        "inference_idle_waiting_env_s": [round(b.inference_idle_env_s, 1) for b in bs],
        "verifier_wait_s": round(verifier_wait_s(result.trajectories), 1),
        "sandbox_held_util": [round(b.sandbox_held_util, 3) for b in bs],
        "outcomes": [b.outcomes for b in bs],
        "complete_batches": sum(1 for b in bs if b.extra.get("complete")),
        "trajectories_accepted": sum(b.n_trajectories for b in bs),
        "attempts_finished": len(result.trajectories),
        "ledger": result.ledger,
        "waste": {"attempts": waste["attempts"], "sandbox_s": round(waste_s, 1),
                  "consumed_sandbox_s": round(consumed_s, 1),
                  "share": round(waste_s / (waste_s + consumed_s), 3) if waste_s + consumed_s else 0,
                  "by_reason": waste["by_reason"]},
        "carried": [a.get("carried", 0) for a in acct],
        "episode_shape": episode_shape(result.trajectories),
        "selection": [b.extra.get("profile", {}) for b in bs],
        "setup_s": round(setup_s, 2),
        "output": str(result.out_dir),
    }


def episode_shape(trajs: Sequence[Trajectory]) -> dict[str, Any]:
    """What every finished attempt looked like: turns, sandbox set-up (fork or fresh start),
    tool seconds, duration (n, mean, p50, p90, max — the selection profile's summary)."""
    from rollbank.scheduling.policy.profile import dist

    return {"turns": dist(float(len(t.steps)) for t in trajs).to_dict(),
            "sandbox_setup_s": dist(t.sandbox_setup_s for t in trajs).to_dict(),
            "tool_s": dist(t.tool_s for t in trajs).to_dict(),
            "duration_s": dist(t.duration_s for t in trajs).to_dict()}


def waste_from_events(path: Path) -> dict[str, Any]:
    """Every attempt settled as waste in a run (in a batch window or at close), with the
    sandbox-slot seconds it held, from the run's event log."""
    from rollbank.metrics.events import read_events

    rows = [e for e in read_events(path) if e.get("kind") == "waste"]
    by: dict[str, int] = {}
    for e in rows:
        by[str(e.get("reason"))] = by.get(str(e.get("reason")), 0) + 1
    return {"attempts": len(rows), "sandbox_s": sum(float(e.get("held_s", 0.0)) for e in rows),
            "by_reason": by}


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    if args.engine != "accel-sim":
        return await _main_arms(args)
    from rollbank.inference.models import ensure_model
    from rollbank.inference.tokenizer import load_tokenizer
    from rollbank.inference_plane import vocab_size
    from rollbank_bench.accelsim.process import AccelSimServers

    tok = load_tokenizer(await asyncio.to_thread(ensure_model, args.model))
    scales = _scales(args)
    async with AccelSimServers(args.accelsim_profile, args.num_servers, vocab_size=vocab_size(tok),
                               log_dir=args.out / "accelsim", token_scale=scales.get("token_scale"),
                               time_scale=scales.get("time_scale")) as engines:
        args.engine_urls = engines.urls
        t0, cpu0 = time.monotonic(), engines.cpu_s()
        report = await _main_arms(args)
        cpu = engines.cpu_s() - cpu0
        wall = time.monotonic() - t0
    report["engine"] = {"kind": "accel-sim", "profile": args.accelsim_profile, "servers": args.num_servers,
                        **scales, "engine_cpu_share_of_one_core": round(cpu / wall, 3) if wall else None,
                        "note": "benchmark instrument: emulated accelerator timing, no model "
                        "(rollbank_bench.accelsim); sandboxes, verifiers, router and scheduler are real"}
    return report


async def _main_arms(args: argparse.Namespace) -> dict[str, Any]:
    from rollbank.inference_plane import open_inference
    from rollbank.metrics.calibrate import calibrate
    from rollbank.task_selection import select_tasks

    t_bench, load_at_start = time.monotonic(), cmp.read_load()
    arms = parse_arms(args.arms)
    configs = {a: arm_config(args, a) for a in arms}
    first = configs[arms[0]]
    tasks = select_tasks(first)
    report: dict[str, Any] = {
        "benchmark": "collect",
        "size": {"groups": args.groups, "group_size": args.group_size,
                 "trajectories_per_batch": args.groups * args.group_size,
                 "pool_groups_bank_lever": bank_lever(args)[0],
                 "max_groups_bank_lever": bank_lever(args)[1], "batches": args.batches},
        "model": args.model, "servers": args.num_servers, "tasks": len(tasks),
        "excluded_costs": first.exclude_costs,
        "capacity_per_arm": {"sandbox_slots": args.sandbox_slots,
                             "inference_slots_per_server": args.inference_slots},
        "workload": first.workload.model_dump(mode="json") if args.workload == "trace"
        else {"kind": "model", "max_turns": args.max_turns, "max_tokens": args.max_tokens},
        "trace_profile": None if agent_trace(args) is None else agent_trace(args).describe(),
        "episode": {"step_timeout_s": args.step_timeout,
                    "verifier_slots": first.runner.verifier_slots or os.cpu_count()},
        "arms": {},
    }
    t_srv = time.monotonic()
    async with open_inference(first.inference, max_model_len=first.runner.max_model_len) as plane:
        report["server_start_s"] = round(time.monotonic() - t_srv, 1)
        cap = await calibrate(plane.clients, sandbox_slots=args.sandbox_slots,
                              vocab_size=plane.vocab_size,
                              verifier_slots=first.runner.verifier_slots or os.cpu_count())
        report["capacity"] = cap.to_dict()
        runs = []
        for rep in range(args.repeats):
            order = cmp.arm_order(arms, rep)
            cfgs = configs if args.repeats == 1 else {
                a: arm_config(args, a, output=args.out / f"repeat{rep}" / a) for a in order}
            done: dict[str, Any] = {}
            runs.append({"repeat": rep, "order": order, "arms": done})
            for arm in order:  # each arm's numbers on disk as soon as it ends
                done[arm] = await _run_arm(args, arm, cfgs[arm], plane, cap, tasks)
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "bench.partial.json").write_text(json.dumps(
                    {**report, "repeats": runs}, default=str))
    report["arms"] = runs[0]["arms"]
    if args.repeats > 1:
        report["arms_note"] = ("arms = repeat 0; every repeat (arm order rotated) is in "
                               "repeats, each arm paired with the same repeat's naive in paired")
        report["repeats"] = runs
        report["paired"] = cmp.paired_comparison(runs)
    report["comparison"] = cmp.compare_arms(report["arms"])
    # every arm's row (time, T_LB/T, waste, tail, engine busy); the levers' contributions
    # where their arms ran
    report["ablation"] = cmp.ablation(report["arms"])
    report["bench_run_s"] = round(time.monotonic() - t_bench, 1)
    report["host_load_1m_start_end"] = [load_at_start, cmp.read_load()]
    return report


async def _run_arm(args: argparse.Namespace, arm: str, cfg: Any, plane: Any, cap: Any,
                   tasks: Sequence[Any]) -> dict[str, Any]:
    """One arm on the shared servers (caches reset first), its host load sampled meanwhile;
    a broken arm is reported as an error, never hides the others' numbers."""
    import contextlib

    from rollbank.collector import collect
    from rollbank.episodes.sandboxes import open_sandboxes
    from rollbank.task_selection import tasks_to_prepare
    from rollbank_bench.sim_inputs import collect_arm_inputs

    await plane.reset_caches()
    t_setup = time.monotonic()
    try:
        async with contextlib.AsyncExitStack() as stack:
            host = await stack.enter_async_context(cmp.HostLoad())
            sandboxes = await stack.enter_async_context(open_sandboxes(
                cfg.sandbox, tasks, prepare=tasks_to_prepare(cfg, tasks)))
            setup = time.monotonic() - t_setup
            result = await collect(cfg, tasks=tasks, inference=plane, sandboxes=sandboxes,
                                   out_dir=Path(cfg.output), capacity=cap, setup_s=setup)
        return {"levers": ARMS[arm.split("#")[0]], **_arm_report(result, setup, args.num_servers),
                "host": host.to_dict(),
                "sim_inputs": collect_arm_inputs(cfg, tasks, accel_profile=args.accelsim_profile
                                                 if args.engine == "accel-sim" else None,
                                                 accel_scales=_scales(args))}
    except Exception as exc:
        return {"levers": ARMS[arm.split("#")[0]], "error": f"{type(exc).__name__}: {exc}"}


def _scales(args: argparse.Namespace) -> dict[str, float]:
    """The accel-sim engine's instrument scales of a ``--trace-profile`` run (else none)."""
    trace = agent_trace(args)
    return {} if trace is None else {"token_scale": float(trace.token_scale),
                                     "time_scale": float(trace.time_scale)}


def run(args: argparse.Namespace) -> int:
    if args.quick:
        _quick(args)
    report = asyncio.run(_main(args))
    text = json.dumps(report, indent=2, default=str)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(text + "\n")
    return 0 if not any("error" in a for a in report["arms"].values()) else 1
