"""`rollbank bench schedule --from-measured FILE.json --at-trajectories N`: the measured run's
naive and all-levers arms simulated to ``N`` trajectories each, timed.

Each arm keeps its measured inputs (scheduler config, trace workload, host costs, engines:
:func:`~rollbank_bench.schedule_measured.simulate_arm`'s model) with only the batch count
raised to ``ceil(N / (G x n))`` (and a launch cap, the bank lever's, by the same number of
groups: its spare groups stay as many as measured); no lifecycle events and no trajectories are kept (the
batches keep their accounting), and the cyclic garbage collector is paused per arm
(:func:`~rollbank_bench.schedule_scale._gc_paused`). Reported per arm: the wall and CPU
seconds the simulation took, beside what it simulated (time per batch, launched, waste);
``both_arms_wall_s`` is the sum, or with ``--parallel-arms`` the wall of the two arms run at
once in two processes.
"""

from __future__ import annotations

import math
import time
from typing import Any

ARMS = ("naive", "optimized")


def _arm(report: dict[str, Any], name: str, trajectories: int, keep_gc: bool) -> dict[str, Any]:
    from rollbank.scheduling.config import SchedulerConfig
    from rollbank.scheduling.sim.simulate import simulate
    from rollbank_bench.schedule_measured import _routed, capacity_for, episode_model
    from rollbank_bench.schedule_scale import _gc_paused
    from rollbank_bench.sim_inputs import ArmCosts

    arm = report["arms"][name]
    inputs = arm["sim_inputs"]
    costs = ArmCosts.from_dict(inputs["costs"])
    cfg = SchedulerConfig.model_validate(inputs["scheduler"])
    per_batch = cfg.groups_per_batch * cfg.bank.group_size
    batches = max(1, math.ceil(trajectories / per_batch))
    update: dict[str, Any] = {"num_batches": batches}
    if cfg.max_groups is not None:  # the bank lever's spare groups stay as many as measured
        update["max_groups"] = cfg.max_groups + cfg.groups_per_batch * (batches - cfg.num_batches)
    cfg = cfg.model_copy(update=update)
    w0, c0 = time.monotonic(), time.process_time()
    with _gc_paused(keep_gc):
        res = simulate(cfg, inputs["task_ids"], episode_model(inputs, costs),
                       capacity=capacity_for(report, costs, _routed(arm)), keep_trajectories=False)
    wall, cpu = time.monotonic() - w0, time.process_time() - c0
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "batches": len(res.batches),
            "trajectories": res.trajectories, "launched": res.launched,
            "us_per_launched_cpu": round(1e6 * cpu / max(1, res.launched), 1),
            "time_per_batch_s": round(res.end_s / max(1, len(res.batches)), 3),
            "waste_share_of_launched": round(res.waste / max(1, res.launched), 4)}


def _job(report: dict[str, Any], name: str, trajectories: int, keep_gc: bool) -> dict[str, Any]:
    return _arm(report, name, trajectories, keep_gc)


def at_scale(report: dict[str, Any], trajectories: int, *, parallel: bool = False,
             keep_gc: bool = False) -> dict[str, Any]:
    from rollbank.errors import UsageError

    missing = [a for a in ARMS if a not in report.get("arms", {}) or "error" in report["arms"][a]]
    if missing:
        raise UsageError(f"--at-trajectories: the measured run has no {', '.join(missing)} arm")
    w0 = time.monotonic()
    if parallel:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as ex:
            futures = {a: ex.submit(_job, report, a, trajectories, keep_gc) for a in ARMS}
            arms = {a: f.result() for a, f in futures.items()}
    else:
        arms = {a: _arm(report, a, trajectories, keep_gc) for a in ARMS}
    pair = time.monotonic() - w0
    return {"trajectories_per_arm": trajectories, "arms_in_parallel": parallel, **arms,
            "both_arms_wall_s": round(pair if parallel else sum(arms[a]["wall_s"] for a in ARMS), 2),
            "both_arms_cpu_s": round(sum(arms[a]["cpu_s"] for a in ARMS), 2),
            "ratio": round(arms["optimized"]["time_per_batch_s"] / arms["naive"]["time_per_batch_s"], 4),
            "gc_paused_per_arm": not keep_gc}
