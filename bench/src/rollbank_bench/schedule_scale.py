"""`rollbank bench schedule --trajectories N [--what-if]`: the policy at scale, timed.

Both arms (naive and optimized) run the real scheduler and ready bank under virtual time
(:func:`~rollbank.scheduling.sim.simulate.simulate`, the model of ``bench/schedule.py``) until
each has delivered ``N`` trajectories (``ceil(N / (G x n))`` batches); the JSON reports the
wall and CPU seconds each arm took to simulate, beside what it simulated (virtual time per
batch, launched, waste). ``--what-if`` adds one-factor sweeps around the base cell — G'/G,
n, sandbox slots, inference servers, tool-latency tail (lognormal sigma) — each point both
arms at ``--what-if-trajectories`` per arm, as a table and (``--plot``) a PNG.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import math
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    from rollbank.scheduling.sim.simulate import SimEpisode

WHAT_IF: dict[str, list[float]] = {
    "pool_ratio": [1.0, 1.25, 1.5, 2.0],  # G'/G
    "group_size": [4, 8, 16],
    "sandbox_slots": [0.5, 1.0, 2.0],  # x the base cell's slots
    "servers": [1, 2, 4, 8],
    "tool_latency_sigma": [0.4, 0.8, 1.2],
}


@contextlib.contextmanager
def _gc_paused(keep_gc: bool) -> Iterator[None]:
    """Pause the cyclic garbage collector for one arm (as ``timeit`` does), unless ``keep_gc``.

    The simulation builds no reference cycles (its objects are freed by reference counting;
    a full collection after a 65,536-trajectory arm finds only the same few hundred import
    time objects as after a small one), but with the collector on, every attempt's records
    surviving to the oldest generation trigger full collections over the whole ledger —
    about a quarter of the arm's CPU time at scale, none of it the policy's."""
    if keep_gc or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _arm(args: argparse.Namespace, task_ids: list[str], *, naive: bool, slots: int,
         pool: int, memo: dict[int, SimEpisode] | None = None) -> dict[str, Any]:
    from rollbank.scheduling.sim.simulate import simulate
    from rollbank_bench.schedule_model import capacity, episode_fn, scheduler_config

    cfg = scheduler_config(args, 0, naive=naive, slots=slots, pool=pool)
    w0, c0 = time.monotonic(), time.process_time()
    with _gc_paused(args.gc):
        res = simulate(cfg, task_ids, episode_fn(args, 0, memo), capacity=capacity(args),
                       keep_trajectories=False)
    wall, cpu = time.monotonic() - w0, time.process_time() - c0
    delivered = res.trajectories
    return {
        "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
        "trajectories": delivered, "batches": len(res.batches), "launched": res.launched,
        "us_per_launched_cpu": round(1e6 * cpu / max(1, res.launched), 1),
        "time_per_batch_s": round(res.end_s / max(1, len(res.batches)), 3),
        "waste": res.waste, "waste_share": round(res.waste / max(1, res.launched), 4),
        "inference_wait_s": round(res.inference_wait_s, 1),
        "verifier_wait_s": round(res.verifier_wait_s, 1),
        "prefill_tokens": res.prefill_tokens, "cached_tokens": res.cached_tokens,
    }


def _arm_job(args: argparse.Namespace, task_ids: list[str], naive: bool, slots: int,
             pool: int) -> dict[str, Any]:
    return _arm(args, task_ids, naive=naive, slots=slots, pool=pool)


def _pair(args: argparse.Namespace, task_ids: list[str], trajectories: int) -> dict[str, Any]:
    args = copy.copy(args)
    args.batches = max(1, math.ceil(trajectories / (args.groups * args.group_size)))
    slots = int(args.sandbox_slots.split(",")[0])
    pool = int(args.pool_groups.split(",")[0])
    w0 = time.monotonic()
    if getattr(args, "parallel_arms", False):
        # one process per arm (each draws its own plans: no shared memo); the pair's wall is
        # the slower arm's on a host with two free cores
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as ex:
            fn, fo = (ex.submit(_arm_job, args, task_ids, nv, slots, pool) for nv in (True, False))
            naive, opt = fn.result(), fo.result()
    else:
        memo: dict[int, SimEpisode] = {}  # the arms share the trace plans (same attempt seeds)
        naive = _arm(args, task_ids, naive=True, slots=slots, pool=pool, memo=memo)
        opt = _arm(args, task_ids, naive=False, slots=slots, pool=pool, memo=memo)
    pair_wall = time.monotonic() - w0
    return {"pair_wall_s": round(pair_wall, 2),
            "arms_in_parallel": bool(getattr(args, "parallel_arms", False)),"groups": args.groups, "group_size": args.group_size, "pool_groups": pool,
            "sandbox_slots": slots, "servers": args.servers, "batches": args.batches,
            "naive": naive, "optimized": opt,
            "ratio": round(opt["time_per_batch_s"] / naive["time_per_batch_s"], 4)}


def _variant(args: argparse.Namespace, factor: str, value: float) -> argparse.Namespace:
    a = copy.copy(args)
    slots = int(args.sandbox_slots.split(",")[0])
    if factor == "pool_ratio":
        a.pool_groups = str(max(args.groups, round(value * args.groups)))
    elif factor == "group_size":
        a.group_size = int(value)
    elif factor == "sandbox_slots":
        a.sandbox_slots = str(max(1, round(value * slots)))
    elif factor == "servers":
        a.servers = int(value)
    elif factor == "tool_latency_sigma":
        a.trace = [*args.trace, f"tool_latency_sigma={value}"]
    return a


def what_if(args: argparse.Namespace, task_ids: list[str]) -> list[dict[str, Any]]:
    rows = []
    for factor, values in WHAT_IF.items():
        for v in values:
            p = _pair(_variant(args, factor, v), task_ids, args.what_if_trajectories)
            rows.append({"factor": factor, "value": v, "naive_s": p["naive"]["time_per_batch_s"],
                         "optimized_s": p["optimized"]["time_per_batch_s"], "ratio": p["ratio"],
                         "waste_share": p["optimized"]["waste_share"],
                         "sim_wall_s": round(p["naive"]["wall_s"] + p["optimized"]["wall_s"], 2)})
    return rows


def plot(rows: list[dict[str, Any]], path: str) -> None:
    from rollbank.extras import require

    require("matplotlib", "report", "bench schedule --plot").use("Agg")
    plt = require("matplotlib.pyplot", "report", "bench schedule --plot")
    factors = list(WHAT_IF)
    fig, axes = plt.subplots(1, len(factors), figsize=(4 * len(factors), 3.4))
    for ax, factor in zip(axes, factors, strict=True):
        pts = [r for r in rows if r["factor"] == factor]
        ax.plot([r["value"] for r in pts], [r["ratio"] for r in pts], "o-", label="time ratio")
        ax.plot([r["value"] for r in pts], [r["waste_share"] for r in pts], "s--",
                label="waste share")
        ax.set_xlabel(factor)
        ax.set_ylim(0, 1.1)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("optimized / naive  |  waste")
    axes[0].legend(fontsize=8)
    fig.suptitle("rollbank bench schedule: what-if (virtual time, real policy)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def scale_main(args: argparse.Namespace) -> dict[str, Any]:
    from rollbank.task_selection import task_sequence
    from rollbank_bench.schedule_model import load_tasks, model_description, workload

    t0 = time.monotonic()
    task_ids = task_sequence(load_tasks(args), 0)
    scale = _pair(args, task_ids, args.trajectories)
    out: dict[str, Any] = {
        "benchmark": "schedule at scale (virtual time)",
        "trajectories_per_arm": args.trajectories,
        "scale": scale,
        # sequential arms: the sum of the arms' walls; --parallel-arms: the pair's own wall
        "both_arms_wall_s": scale["pair_wall_s"] if scale["arms_in_parallel"] else
        round(scale["naive"]["wall_s"] + scale["optimized"]["wall_s"], 2),
        "both_arms_cpu_s": round(scale["naive"]["cpu_s"] + scale["optimized"]["cpu_s"], 2),
        "per_attempt": model_description(args),
        "workload": workload(args, 0).config.model_dump(mode="json"),
        "straggler": args.straggler,
        "gc_paused_per_arm": not args.gc,
    }
    if args.what_if:
        rows = what_if(args, task_ids)
        out["what_if"] = {"trajectories_per_arm": args.what_if_trajectories, "rows": rows}
        if args.plot:
            plot(rows, args.plot)
            out["what_if"]["plot"] = args.plot
    out["bench_run_s"] = round(time.monotonic() - t0, 2)
    return out
