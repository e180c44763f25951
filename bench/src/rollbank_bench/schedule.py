"""`rollbank bench schedule`: the scheduling lever alone, in virtual time, swept and repeated (JSON).

The real :class:`~rollbank.scheduling.policy.scheduler.Scheduler` and ready bank run under a fake
clock (:func:`~rollbank.scheduling.sim.simulate.simulate`) on the trace workload the real benchmark
uses (:mod:`rollbank.episodes.workload`, same task ids and seeds).

``--model contention`` (default): an attempt holds a sandbox slot for ``--start-s``, then per
planned turn a generate call on its group's server that waits for one of the scheduler's
``--inference-slots`` and takes the latency profile's time (prefill of uncached prompt tokens:
the group's ``--prompt-tokens`` once per server, then ``--obs-tokens`` per turn; decode at the
batch size it joins), then the turn's tool latency; then ``--verify-s`` inside one of the
scheduler's ``--verifier-slots``. ``--model durations``: the older fixed-duration model
(``overhead_s`` + per turn tokens / ``decode_rate`` + ``ttft_s`` + tool latency), no contention.
Not modelled: CPU contention between sandboxes and inference, cold starts, cache eviction.
Every (sandbox slots, G') cell is repeated with ``--repeats`` seeds (task order, workload and
attempt seeds all change) and reported as median and range. ``--trajectories N`` instead
times both arms at scale (``bench/schedule_scale.py``), with ``--what-if`` sweeps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from rollbank_bench.collect import add_trace_argument
from rollbank_bench.schedule_model import (  # re-exported: the command's public names
    capacity,
    episode_fn,
    load_tasks,
    model_description,
    scheduler_config,
    workload,
)

__all__ = ["add_arguments", "capacity", "episode_fn", "load_tasks", "model_description", "run",
           "scheduler_config", "workload"]


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
    a("--overhead-s", type=float, default=1.0,
      help="durations model: sandbox start + verifier per attempt (s)")
    a("--model", default="contention", choices=("contention", "durations"),
      help="contention: inference/verifier slots, latency profile, prefix cache")
    a("--start-s", type=float, default=0.5, help="contention: sandbox start per attempt (s)")
    a("--verify-s", type=float, default=0.5, help="contention: verifier run per attempt (s)")
    a("--verifier-slots", type=int, default=0, help="contention: verifier slots (0: unlimited)")
    a("--servers", type=int, default=4, help="contention: inference servers")
    a("--inference-slots", type=int, default=64, help="contention: generate slots per server")
    a("--prompt-tokens", type=int, default=512, help="contention: task prompt (group prefix)")
    a("--obs-tokens", type=int, default=64, help="contention: observation tokens per turn")
    a("--prefill-s-per-token", type=float, default=0.0001, help="profile: prefill s/token")
    a("--decode-s-per-token", type=float, default=0.005, help="profile: decode s/token alone")
    a("--decode-batch-slope", type=float, default=0.01,
      help="profile: decode slowdown per extra sequence in the batch")
    a("--no-prefix-cache", action="store_true", help="contention: every prompt prefilled")
    a("--trajectories", type=int, default=0,
      help="scale run: both arms to this many trajectories each, wall/CPU time per arm")
    a("--what-if", action="store_true",
      help="with --trajectories: one-factor sweeps (G'/G, n, slots, servers, tool tail)")
    a("--plot", default="", help="with --what-if: write the sweep plot (PNG) here")
    a("--what-if-trajectories", type=int, default=16384,
      help="with --what-if: trajectories per arm at each sweep point")
    a("--parallel-arms", action="store_true",
      help="with --trajectories: run the naive and optimized arms in two processes at once "
      "(each draws its own trace plans); both_arms_wall_s is then the pair's wall")
    a("--gc", action="store_true",
      help="with --trajectories: keep Python's cyclic garbage collector on while an arm "
      "runs (default: paused per arm, as timeit does; the simulation makes no cycles)")
    a("--decision-cost", type=int, default=0, metavar="N",
      help="time the scheduler per decision with N attempts in flight (see "
      "rollbank_bench.schedule_decision; --groups, --group-size apply)")
    a("--decisions", type=int, default=20000, help="with --decision-cost: decisions timed")
    a("--from-measured", default="", metavar="FILE.json",
      help="simulate each arm of a measured `bench collect --engine accel-sim` JSON on its "
      "measured inputs; simulated vs measured time per batch (rollbank_bench.schedule_measured)")
    a("--sweep", action="store_true",
      help="with --from-measured: re-simulate the optimized arm over G', a launch cap "
      "and the straggler policy on the same inputs (time, ratio vs naive, waste)")
    a("--sweep-seeds", type=int, default=1,
      help="with --sweep: also the median and worst over this many scheduler seeds")
    a("--at-size", default="", metavar="G,N,B",
      help="with --from-measured: predict every arm at G groups of N, a B-batch window, on "
      "the measured inputs (rollbank_bench.schedule_predict); --sweep then runs at that size")
    a("--at-slots", type=int, default=None, help="with --at-size: sandbox slots")
    a("--at-pool", type=int, default=None, help="with --at-size: bank arms' G' (default 2 G)")
    a("--at-spare", type=int, default=None,
      help="with --at-size: bank arms' launch cap = B x G + this (default ceil(G/4))")
    a("--verify-scale", type=float, default=1.0,
      help="with --at-size: multiply every arm's measured verifier run by this")
    a("--at-trace-profile", default="", metavar="NAME",
      help="with --from-measured: predict bench collect's per-lever ablation on this agent-"
      "shaped trace (rollbank_bench.traces) with the run's measured host costs "
      "(rollbank_bench.schedule_trace)")
    a("--at-servers", type=int, default=None, help="with --at-trace-profile: engines (16)")
    a("--at-trajectories", type=int, default=0, metavar="N",
      help="with --from-measured: the measured naive and all-levers arms simulated to N "
      "trajectories each on their measured inputs, wall/CPU time per arm (--parallel-arms: "
      "the two at once)")
    a("--what-if-verifier-slots", type=int, default=None, metavar="N",
      help="with --from-measured: also every arm re-simulated with N verifier slots (e.g. one "
      "per sandbox, as on a cluster), time and ratio vs the naive arm so simulated")
    a("--at-hold-extras-for-verifier", choices=("measured", "on", "off"), default="measured",
      help="with --at-size: bank arms' scheduler.hold_extras_for_verifier (measured: as run)")


def _one(args: argparse.Namespace, task_ids: list[str], seed: int, *, naive: bool, slots: int,
         pool: int) -> dict[str, float]:
    from rollbank.scheduling.sim.simulate import simulate

    cfg = scheduler_config(args, seed, naive=naive, slots=slots, pool=pool)
    res = simulate(cfg, task_ids, episode_fn(args, seed), capacity=capacity(args))
    return {"time_per_batch_s": res.end_s / args.batches, "launched": res.launched,
            "waste": res.waste, "waste_share": res.waste / res.launched if res.launched else 0.0}


def _spread(xs: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3),
            "max": round(max(xs), 3)}


def _main(args: argparse.Namespace) -> dict[str, Any]:
    from rollbank.task_selection import task_sequence

    if args.from_measured:
        if getattr(args, "at_trace_profile", ""):
            from rollbank_bench.schedule_trace import trace_main

            return trace_main(args)
        if getattr(args, "at_size", ""):
            from rollbank_bench.schedule_predict import predict_main

            return predict_main(args)
        from rollbank_bench.schedule_measured import from_measured_main, load_measured

        out = from_measured_main(args)
        if args.at_trajectories:
            from rollbank_bench.schedule_measured_scale import at_scale

            out["at_scale"] = at_scale(load_measured(Path(args.from_measured)),
                                       args.at_trajectories, parallel=args.parallel_arms,
                                       keep_gc=args.gc)
        return out
    if args.decision_cost:
        from rollbank_bench.schedule_decision import decision_cost

        return decision_cost(args)
    if args.trajectories:
        from rollbank_bench.schedule_scale import scale_main

        return scale_main(args)
    t0 = time.monotonic()
    tasks = load_tasks(args)
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
        "model": "real Scheduler + ready bank on a fake clock (see bench/schedule.py)",
        "size": {"groups": args.groups, "group_size": args.group_size, "batches": args.batches,
                 "repeats": args.repeats, "straggler": args.straggler, "tasks": len(tasks)},
        "workload": workload(args, 0).config.model_dump(mode="json"),
        "per_attempt": model_description(args),
        "cells": cells,
        "bench_run_s": round(time.monotonic() - t0, 2),
    }


def run(args: argparse.Namespace) -> int:
    print(json.dumps(_main(args), indent=2))
    return 0
