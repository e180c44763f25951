"""`rollbank bench schedule --from-measured FILE.json --at-trace-profile NAME`: the per-lever
ablation of ``bench collect`` predicted on an agent-shaped trace (a prediction, not a fit).

FILE is an accel-sim ``bench collect`` run; its arms' measured per-attempt host costs (sandbox
set-up of the fresh-start and of the forked arms, a command's round trip, the call overhead,
the verifier run, close) are kept. Everything else is what ``bench collect --trace-profile
NAME`` would run (:mod:`rollbank_bench.collect_args`: each ablation arm's scheduler config,
the trace profile's workload, ``--at-servers`` engines at the profile's token and time
scales), simulated with the long-context model (:func:`~rollbank_bench.sim_inputs.sim_profile_long`,
the real router of each arm, the runner's context limit at the trace's ``max_model_len``). Per arm over ``--sweep-seeds``
seeds: time per batch, ratio vs naive, waste; with ``--what-if-verifier-slots N`` also with N
verifier slots (one per sandbox) instead of the host's.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path
from typing import Any

from rollbank_bench.schedule_measured import load_measured, simulate_arm

ARM_NAMES = ("naive", "optimized", "sandboxes", "all_but_sandboxes", "routing", "all_but_routing",
             "ready_bank", "all_but_ready_bank", "overprovision", "all_but_overprovision")


def _collect_args(report: dict[str, Any], trace: str, servers: int) -> argparse.Namespace:
    from rollbank_bench.collect_args import add_arguments

    size = report.get("size") or {}
    p = argparse.ArgumentParser()
    add_arguments(p)
    return p.parse_args([
        "--engine", "accel-sim", "--trace-profile", trace, "--num-servers", str(servers),
        "--groups", str(size.get("groups", 32)), "--group-size", str(size.get("group_size", 8)),
        "--batches", str(size.get("batches", 3))])


def arm_inputs_at_trace(report: dict[str, Any], args: argparse.Namespace,
                        arm: str) -> dict[str, Any]:
    """``arm``'s simulator inputs: its ``bench collect`` config at the trace profile, the
    measured host costs of the measured arm with the same sandbox lever."""
    from rollbank_bench.collect_args import ARMS, arm_config
    from rollbank_bench.traces import TOKENS_PER_CHAR

    cfg = arm_config(args, arm)
    warm = ARMS[arm]["sandboxes"]
    measured = report["arms"]["optimized" if warm else "naive"]["sim_inputs"]
    sched = cfg.scheduler.model_dump(mode="json")
    sched["verifier_slots"] = measured["scheduler"]["verifier_slots"]
    costs = {**measured["costs"], "obs_tokens_per_char": TOKENS_PER_CHAR}
    return {**measured, "scheduler": sched, "workload": cfg.workload.model_dump(mode="json"),
            "costs": costs, "context": {"max_model_len": cfg.runner.max_model_len,
                                        "min_new_tokens": cfg.runner.min_new_tokens}}


def predict_at_trace(report: dict[str, Any], trace: str, *, servers: int = 16, seeds: int = 1,
                     verifier_slots: int | None = None,
                     arm_names: tuple[str, ...] = ARM_NAMES) -> dict[str, Any]:
    from rollbank_bench.collect_args import ARMS, agent_trace

    args = _collect_args(report, trace, servers)
    t = agent_trace(args)
    world = {**report, "servers": servers, "engine": {
        **(report.get("engine") or {}), "kind": "accel-sim", "servers": servers,
        "token_scale": float(t.token_scale), "time_scale": float(t.time_scale)}}
    over = {} if verifier_slots is None else {"verifier_slots": verifier_slots}
    arms: dict[str, Any] = {}
    for arm in arm_names:
        inputs = arm_inputs_at_trace(report, args, arm)
        base = int(inputs["scheduler"].get("seed", 0))
        sims = [simulate_arm(world, inputs, {**over, "seed": base + k},
                             prefix_cache=ARMS[arm]["routing"])[1] for k in range(seeds)]
        arms[arm] = {"time_per_batch_s": [s["time_per_batch_s"] for s in sims],
                     "waste_share_of_launched": [s["waste_share_of_launched"] for s in sims],
                     "verifier_wait_s": [s["verifier_wait_s"] for s in sims]}
    naive = arms["naive"]["time_per_batch_s"]
    for a in arms.values():
        r = [x / n for x, n in zip(a["time_per_batch_s"], naive, strict=True)]
        a["ratio_vs_naive"] = {"median": round(statistics.median(r), 3),
                               "min": round(min(r), 3), "max": round(max(r), 3)}
    return {"trace_profile": t.describe(), "servers": servers, "seeds": seeds,
            "verifier_slots": verifier_slots or "as measured", "arms": arms}


def trace_main(args: argparse.Namespace) -> dict[str, Any]:
    path = Path(args.from_measured)
    report = load_measured(path)
    seeds = max(1, args.sweep_seeds)
    servers = args.at_servers or 16
    out: dict[str, Any] = {
        "benchmark": "schedule prediction on an agent-shaped trace (virtual time, the measured "
                     "run's host costs)", "measured": str(path),
        "as_measured": predict_at_trace(report, args.at_trace_profile, servers=servers,
                                        seeds=seeds)}
    if args.what_if_verifier_slots:
        out["what_if_verifier_slots"] = predict_at_trace(
            report, args.at_trace_profile, servers=servers, seeds=seeds,
            verifier_slots=args.what_if_verifier_slots)
    return out
