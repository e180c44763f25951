"""`rollbank bench schedule`: the scheduling lever alone, in virtual time, swept and repeated (JSON).

The real :class:`~rollbank.scheduling.scheduler.Scheduler` and ready bank run under a fake
clock (:func:`~rollbank.scheduling.simulate.simulate`) on the trace workload the real benchmark
uses (:mod:`rollbank.episodes.workload`, same task ids and seeds): an attempt holds a sandbox
slot for ``overhead_s`` (sandbox start + verifier) plus, per planned turn, its decode time at
``decode_rate`` tokens/s plus ``ttft_s`` plus the turn's tool latency. Nothing else is
modelled: no CPU contention between inference, sandboxes and verifiers, no cold starts, no
prefill — so this isolates what over-provisioning and the straggler policy buy on a given tail
shape, and runs in seconds. Every (sandbox slots, G') cell is repeated with ``--repeats``
seeds (task order, workload and attempt seeds all change) and reported as median and range.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import TYPE_CHECKING, Any

from rollbank.bench.collect import add_trace_argument, trace_overrides

if TYPE_CHECKING:
    from rollbank.episodes.workload import TraceWorkload


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--json", action="store_true", help="print one JSON object (the default output anyway)")
    a("--groups", type=int, default=32, help="G: complete groups per batch")
    a("--group-size", type=int, default=8, help="n: siblings per group")
    a("--pool-groups", default="32,40,48,64", help="G' values to sweep (comma-separated)")
    a("--sandbox-slots", default="64,128,256", help="sandbox slot counts to sweep")
    a("--batches", type=int, default=4, help="batches per run (the multi-batch window)")
    a("--repeats", type=int, default=5, help="seeds per cell (median and range are reported)")
    a("--straggler", default="carry", choices=("carry", "abort"), help="optimized policy")
    a("--tasks", nargs="+", default=["terminal-lite"], help="task folders or suites (ids only)")
    a("--exclude-costs", default="expensive-env", help="comma-separated task costs left out")
    add_trace_argument(parser)
    a("--decode-rate", type=float, default=200.0, help="tokens/s of one sequence")
    a("--ttft-s", type=float, default=0.02, help="time to first token per turn (s)")
    a("--overhead-s", type=float, default=1.0, help="sandbox start + verifier per attempt (s)")


def _workload(args: argparse.Namespace, seed: int) -> TraceWorkload:
    from rollbank.episodes.workload import TraceWorkload, WorkloadConfig

    o: dict[str, Any] = {**trace_overrides(args), "kind": "trace", "seed": seed}
    return TraceWorkload(WorkloadConfig.model_validate(o))


def _one(args: argparse.Namespace, task_ids: list[str], seed: int, *, naive: bool, slots: int,
         pool: int) -> dict[str, float]:
    from rollbank.scheduling.config import ReadyBankConfig, SchedulerConfig
    from rollbank.scheduling.simulate import SimEpisode, simulate
    from rollbank.scheduling.types import AttemptSpec, SchedulingMode, StragglerPolicy

    w = _workload(args, seed)

    def episode(spec: AttemptSpec) -> SimEpisode:
        plan = w.plan(spec.task_id, spec.seed)
        turn_s = sum(t.tokens / args.decode_rate + args.ttft_s + t.tool_s for t in plan.turns)
        return SimEpisode(args.overhead_s + turn_s)

    cfg = SchedulerConfig(
        mode=SchedulingMode.NAIVE if naive else SchedulingMode.OPTIMIZED,
        groups_per_batch=args.groups, pool_groups=args.groups if naive else pool,
        straggler=StragglerPolicy.WAIT if naive else StragglerPolicy(args.straggler),
        sandbox_slots=slots, num_batches=args.batches, seed=seed,
        bank=ReadyBankConfig(group_size=args.group_size),
    )
    res = simulate(cfg, task_ids, episode)
    return {"time_per_batch_s": res.end_s / args.batches, "launched": res.launched,
            "waste": res.waste, "waste_share": res.waste / res.launched if res.launched else 0.0}


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3),
            "max": round(max(xs), 3)}


def _main(args: argparse.Namespace) -> dict[str, Any]:
    from rollbank.collect_config import load_collect_config
    from rollbank.collector import select_tasks, task_sequence

    t0 = time.monotonic()
    cfg = load_collect_config(None, {"tasks": args.tasks, "exclude_costs": [
        c for c in args.exclude_costs.split(",") if c]})
    tasks = select_tasks(cfg)
    pools = [int(x) for x in args.pool_groups.split(",") if x]
    slot_counts = [int(x) for x in args.sandbox_slots.split(",") if x]
    seeds = list(range(args.repeats))
    cells: list[dict[str, Any]] = []
    for slots in slot_counts:
        naive = {s: _one(args, task_sequence(tasks, s), s, naive=True, slots=slots, pool=0)
                 for s in seeds}
        for pool in pools:
            opt = {s: _one(args, task_sequence(tasks, s), s, naive=False, slots=slots, pool=pool)
                   for s in seeds}
            ratios = [opt[s]["time_per_batch_s"] / naive[s]["time_per_batch_s"] for s in seeds]
            cells.append({
                "sandbox_slots": slots, "pool_groups": pool,
                "naive_s": _spread([naive[s]["time_per_batch_s"] for s in seeds]),
                "optimized_s": _spread([opt[s]["time_per_batch_s"] for s in seeds]),
                "ratio": _spread(ratios),
                "waste_attempts": _spread([opt[s]["waste"] for s in seeds]),
                "waste_share_of_launched": _spread([opt[s]["waste_share"] for s in seeds]),
            })
    return {
        "benchmark": "schedule (virtual time)",
        "model": "real Scheduler + ready bank on a fake clock; attempt = overhead + per turn "
                 "(tokens / decode_rate + ttft + tool latency); no CPU contention",
        "size": {"groups": args.groups, "group_size": args.group_size, "batches": args.batches,
                 "repeats": args.repeats, "straggler": args.straggler, "tasks": len(tasks)},
        "workload": _workload(args, 0).config.model_dump(mode="json"),
        "per_attempt": {"decode_rate": args.decode_rate, "ttft_s": args.ttft_s,
                        "overhead_s": args.overhead_s},
        "cells": cells,
        "bench_run_s": round(time.monotonic() - t0, 2),
    }


def run(args: argparse.Namespace) -> int:
    print(json.dumps(_main(args), indent=2))
    return 0
