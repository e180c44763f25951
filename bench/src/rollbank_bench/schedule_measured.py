"""`rollbank bench schedule --from-measured FILE.json`: the simulator against a measured run.

FILE is a ``rollbank bench collect`` JSON. For each arm the simulator
(:func:`~rollbank.scheduling.sim.simulate.simulate`, the real scheduler and ready bank in virtual
time) is given that arm's measured inputs (:mod:`rollbank_bench.sim_inputs`: the resolved
scheduler config, the verifier slots, the task sequence, the trace workload — hence the same
plans and attempt seeds — and the per-attempt costs measured in that arm) and the engine's
latency profile (accelsim, :func:`~rollbank_bench.sim_inputs.sim_profile`, servers as run).
An agent-shaped (``--trace-profile``) run gets the long-context model instead
(:func:`capacity_for`): the fluid decode, the real router, the engine's prefix cache, and the
runner's context limit on each episode (:func:`context_limited`). The JSON reports per arm the
simulated and measured time per batch and batch times, the error ``(simulated - measured) /
measured``, launched attempts, waste and prefix-cache hit rates; a long-context run also
``what_if_no_kv_read``.

A ``--repeats N`` FILE (arms interleaved, :mod:`rollbank_bench.collect_compare`) is compared
repeat by repeat (``repeats``: each repeat's arms on their own inputs, with the order they ran).

The inputs come from the arm's ``sim_inputs`` in FILE (written by ``bench collect`` since
this module exists) or, for an older FILE, from the arm's output directory if it still exists.

``--sweep``: the optimized arm's bank lever re-simulated on the same inputs — G' (pool), a
launch cap (``scheduler.max_groups`` = batches x G + spare groups) and the straggler policy —
each cell reporting time per batch, ratio vs the simulated naive arm and waste (share of
launched attempts and of sandbox-seconds), on the measured seeds and (``--sweep-seeds N``)
as median and worst over N scheduler seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
from pathlib import Path
from typing import Any

from rollbank.scheduling.sim.sim_model import SimCapacity, SimTurn
from rollbank.scheduling.sim.simulate import SimEpisode, SimResult, simulate
from rollbank_bench.sim_inputs import (
    ArmCosts,
    arm_inputs,
    attempt_key,
    sim_profile,
    sim_profile_long,
)


def load_measured(path: Path) -> dict[str, Any]:
    """The collect report, each arm with its ``sim_inputs`` (read from the arm's output
    directory when the report predates them)."""
    from rollbank.errors import UsageError

    report: dict[str, Any] = json.loads(path.read_text())
    if report.get("benchmark") != "collect":
        raise UsageError(f"--from-measured {path}: not a `rollbank bench collect` JSON")
    profile = _accel_profile(report)
    limit = (report.get("trace_profile") or {}).get("max_model_len")
    long_ctx = bool((report.get("engine") or {}).get("token_scale"))
    for name, arm in report.get("arms", {}).items():
        if "error" in arm:
            continue
        inputs = arm.get("sim_inputs")
        if inputs is not None and long_ctx and "lone_calls" not in (inputs.get("plan_check") or {}):
            # a long-context report from before the call overhead was measured on lone calls:
            # re-read the arm's episodes if they are still there, else no overhead (its old
            # figure counted the batching the simulator charges itself)
            out = Path(str(arm.get("output", "")))
            if (out / "config.resolved.json").is_file():  # the same task sequence and budgets
                inputs = arm["sim_inputs"] = arm_inputs(
                    out, task_ids=inputs["task_ids"], budgets=inputs.get("budgets"),
                    verifier_slots=inputs["scheduler"].get("verifier_slots"),
                    accel_profile=profile)
            else:
                inputs["costs"] = {**inputs["costs"], "call_s": 0.0}
                inputs["call_s_note"] = "not measured on lone calls in this report: 0 assumed"
        if inputs is not None:
            if limit and "context" not in inputs:  # a report from before it was kept
                inputs["context"] = {"max_model_len": int(limit), "min_new_tokens": 16}
            continue
        out = Path(str(arm.get("output", "")))
        if not (out / "config.resolved.json").is_file():
            raise UsageError(f"--from-measured {path}: arm {name} has no sim_inputs and its "
                             f"output directory {out} is gone")
        arm["sim_inputs"] = arm_inputs(
            out, verifier_slots=report.get("episode", {}).get("verifier_slots"),
            accel_profile=profile)
    return report


def _accel_profile(report: dict[str, Any]) -> Any:
    """The run's accelsim profile with its instrument scales (a ``--trace-profile`` run)."""
    from rollbank_bench.accelsim.profile import load_profile, with_overrides

    engine = report.get("engine") or {}
    if engine.get("kind") != "accel-sim":
        return None
    return with_overrides(load_profile(engine["profile"]), token_scale=engine.get("token_scale"),
                          time_scale=engine.get("time_scale"))


def capacity_for(report: dict[str, Any], costs: ArmCosts,
                 prefix_cache: bool = True, kv_read: bool = True) -> SimCapacity:
    """The measured run's engines: accelsim profile at the arm's prompt length plus the
    measured per-call overhead, as many servers as ran. A ``--trace-profile`` run (scaled
    engine) gets the long-context model (:func:`~rollbank_bench.sim_inputs.sim_profile_long`)
    with the router the arm ran on every call (``prefix_cache``: cache-aware, else round
    robin) and the engine's prefix cache; ``kv_read`` False zeroes the decode steps' KV read
    (a what-if)."""
    accel = _accel_profile(report)
    servers = int((report.get("engine") or {}).get("servers") or report.get("servers") or 1)
    if accel is None:
        from rollbank.errors import UsageError

        raise UsageError("--from-measured: only accel-sim runs are modelled (the CPU regime's "
                         "inference shares the sandboxes' cores, which the simulator does not model)")
    if (report.get("engine") or {}).get("token_scale"):
        prof = sim_profile_long(accel, call_s=costs.call_s)
        if not kv_read:  # what-if: decode steps that do not read the contexts' KV
            prof = dataclasses.replace(prof, decode_s_per_ctx_token=0.0)
        return SimCapacity(servers, prof, prefix_cache=prefix_cache, router=_router(prefix_cache))
    return SimCapacity(servers, sim_profile(accel, context_tokens=costs.prompt_tokens,
                                            call_s=costs.call_s))


def _router(cache_aware: bool) -> Any:
    """The real router the arm ran (``bench collect``'s routing lever: cache-aware or round
    robin, the router's other settings its defaults), as the simulator builds it."""
    from rollbank.routing.factory import make_router

    policy = "cache_aware" if cache_aware else "round_robin"
    return lambda servers, clock: make_router(policy, servers, clock)


def budgeted(tools: list[float], budget: float | None) -> list[float]:
    """A plan's tool seconds under an episode budget: the runner stops the command that
    spends the rest of it and runs no later turn (``episodes/tools.py``)."""
    if budget is None:
        return list(tools)
    out: list[float] = []
    used = 0.0
    for tool in tools:
        if used + tool >= budget:
            out.append(max(0.0, budget - used))
            break
        out.append(tool)
        used += tool
    return out


def context_limited(turns: list[tuple[int, int, float]],
                    context: dict[str, int] | None) -> list[tuple[int, int, float]]:
    """(new prompt tokens, generated tokens, tool seconds) per turn under the runner's context
    rule (``episodes/runner.py``): a turn generates at most the room left in ``max_model_len``
    and is not taken with less than ``min_new_tokens`` of room; an observation after which no
    turn would fit ends the episode after that turn's command (``context_exhausted``, then the
    verifier as usual). ``context`` None: unlimited."""
    if not context:
        return turns
    limit, floor = int(context["max_model_len"]), int(context.get("min_new_tokens", 16))
    out: list[tuple[int, int, float]] = []
    ctx = 0
    for k, (prompt, tokens, tool) in enumerate(turns):
        ctx += prompt
        room = limit - ctx
        if room < floor:
            break
        tokens = min(tokens, room)
        ctx += tokens
        out.append((prompt, tokens, tool))
        if k + 1 < len(turns) and ctx + turns[k + 1][0] + floor > limit:
            break
    return out


def episode_model(inputs: dict[str, Any], costs: ArmCosts) -> Any:
    """Attempt -> :class:`SimEpisode`: the arm's trace plan with its measured costs (its own
    measured verifier run where ``verify_s_by_attempt`` has it)."""
    from rollbank.episodes.workload import TraceWorkload, WorkloadConfig

    w = TraceWorkload(WorkloadConfig.model_validate(inputs["workload"]))
    budgets: dict[str, float] = inputs.get("budgets") or {}
    context = inputs.get("context")
    # each attempt's measured verifier run where the report has it, else the arm's mean
    verify_by: dict[str, float] = inputs.get("verify_s_by_attempt") or {}
    memo: dict[tuple[str, int], SimEpisode] = {}

    def fn(spec: Any) -> SimEpisode:
        key = (spec.task_id, spec.seed)
        ep = memo.get(key)
        if ep is None:
            plan = w.plan(spec.task_id, spec.seed).turns
            # the budget counts a command's whole billed time, its round trip included
            tools = budgeted([t.tool_s + costs.turn_overhead_s for t in plan],
                             budgets.get(spec.task_id))
            per_char = costs.obs_tokens_per_char  # the previous turn's printed output
            kept = context_limited(
                [(costs.obs_tokens + round(per_char * plan[k - 1].obs_chars) if k
                  else costs.prompt_tokens, t.tokens, tool)
                 for k, (t, tool) in enumerate(zip(plan[:len(tools)], tools, strict=True))],
                context)
            last = len(kept) - 1
            turns = tuple(SimTurn(p, n, tool + (costs.close_s if k == last else 0.0))
                          for k, (p, n, tool) in enumerate(kept))
            verify = verify_by.get(attempt_key(spec.task_id, spec.seed), costs.verify_s)
            ep = memo[key] = SimEpisode(costs.setup_s, turns=turns, verify_s=verify)
        return ep

    return fn


def simulate_arm(report: dict[str, Any], inputs: dict[str, Any],
                 overrides: dict[str, Any] | None = None,
                 costs: ArmCosts | None = None, prefix_cache: bool = True,
                 kv_read: bool = True) -> tuple[SimResult, dict[str, Any]]:
    """One arm in virtual time on its measured inputs (``overrides``: scheduler fields;
    ``prefix_cache``: the arm routed cache-aware, see :func:`capacity_for`)."""
    from rollbank.scheduling.config import SchedulerConfig

    costs = costs or ArmCosts.from_dict(inputs["costs"])
    cfg = SchedulerConfig.model_validate({**inputs["scheduler"], **(overrides or {})})
    events: list[Any] = []
    res = simulate(cfg, inputs["task_ids"], episode_model(inputs, costs),
                   capacity=capacity_for(report, costs, prefix_cache, kv_read), events=events)
    waste_s = sum(float(getattr(e, "held_s", 0.0)) for e in events
                  if getattr(getattr(e, "kind", None), "value", None) == "waste")
    consumed_s = sum(b.accounting.consumed_s for b in res.batches)
    n = max(1, len(res.batches))
    return res, {
        "time_per_batch_s": round(res.end_s / n, 2),
        "batch_times_s": [round(x, 2) for x in res.batch_times],
        "launched": res.launched, "waste": res.waste,
        "waste_share_of_launched": round(res.waste / res.launched, 3) if res.launched else 0.0,
        "waste_share_of_sandbox_s": round(waste_s / (waste_s + consumed_s), 3)
        if waste_s + consumed_s else 0.0,
        "verifier_wait_s": round(res.verifier_wait_s, 1),
        "inference_wait_s": round(res.inference_wait_s, 1),
        "prefix_hit_rate": round(res.cached_tokens / (res.cached_tokens + res.prefill_tokens), 3)
        if res.cached_tokens + res.prefill_tokens else None,
    }


def _routed(arm: dict[str, Any]) -> bool:
    """Did the arm route cache-aware (its levers; an older report's arms count as routed)?"""
    return bool((arm.get("levers") or {}).get("routing", True))


def compare(report: dict[str, Any]) -> dict[str, Any]:
    """Per arm: simulated vs measured time per batch and its error; waste, prefix-cache hit
    rate and the verifier-slot wait both ways (measured where the run reported it)."""
    arms: dict[str, Any] = {}
    for name, arm in report.get("arms", {}).items():
        if "error" in arm:
            continue
        inputs = arm["sim_inputs"]
        _, sim = simulate_arm(report, inputs, prefix_cache=_routed(arm))
        meas = float(arm["time_per_batch_s"])
        hits = arm.get("prefix_cache_hit_rate") or []
        ledger = arm.get("ledger", {})
        launched = int(ledger.get("launched", 0))
        arms[name] = {
            "measured_s": round(meas, 2), "simulated_s": sim["time_per_batch_s"],
            "error": round((sim["time_per_batch_s"] - meas) / meas, 4),
            "measured_batch_times_s": [round(x, 2) for x in arm.get("batch_times_s", [])],
            "simulated_batch_times_s": sim["batch_times_s"],
            "measured_launched": launched, "simulated_launched": sim["launched"],
            "measured_waste_share_of_launched":
                round(int(ledger.get("waste", 0)) / launched, 3) if launched else 0.0,
            "simulated_waste_share_of_launched": sim["waste_share_of_launched"],
            "measured_waste_share_of_sandbox_s": arm.get("waste", {}).get("share"),
            "simulated_waste_share_of_sandbox_s": sim["waste_share_of_sandbox_s"],
            # the engines' prefix-cache hit rate per batch, measured; over the run, simulated
            "measured_prefix_hit_rate": [round(float(h), 3) for h in hits],
            "simulated_prefix_hit_rate": sim["prefix_hit_rate"],
            # seconds finished episodes waited for a verifier slot, summed over the run
            "measured_verifier_wait_s": arm.get("verifier_wait_s"),
            "simulated_verifier_wait_s": sim["verifier_wait_s"],
            "costs": inputs["costs"], "plan_check": inputs.get("plan_check"),
        }
    naive = arms.get("naive")
    out: dict[str, Any] = {"arms": arms}
    if naive:
        out["ratio_vs_naive"] = {
            k: {"measured": round(a["measured_s"] / naive["measured_s"], 3),
                "simulated": round(a["simulated_s"] / naive["simulated_s"], 3)}
            for k, a in arms.items() if k != "naive"}
    out["max_abs_error"] = round(max((abs(a["error"]) for a in arms.values()), default=0.0), 4)
    return out


SWEEP_POOL = (1.0, 1.25, 1.5, 2.0)  # G'/G (besides "the whole capped window at once")
SWEEP_SPARE = (None, 0.0, 0.125, 0.25, 0.375)  # launch cap: batches x G + ceil(this x G)
SWEEP_STRAGGLER = ("carry", "abort")


def _cells(groups: int, batches: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for spare in SWEEP_SPARE:
        cap = None if spare is None else batches * groups + math.ceil(spare * groups)
        pools = {max(groups, round(r * groups)) for r in SWEEP_POOL}
        if cap is not None:
            pools = {p for p in pools if p < cap} | {cap}
        for pool in sorted(pools):
            for straggler in SWEEP_STRAGGLER:
                out.append({"pool_groups": pool, "max_groups": cap, "straggler": straggler})
    return out


def sweep(report: dict[str, Any], seeds: int = 1, arm: str = "optimized") -> list[dict[str, Any]]:
    """The optimized arm's bank lever (G', launch cap, straggler policy) on its measured
    inputs, against the simulated naive arm on the same scheduler seed. Seed 0 is the
    measured run's; ``seeds`` > 1 also reports the median and worst over seeds 0..seeds-1
    (other attempt seeds, hence other plans, same costs)."""
    arms = report["arms"]
    inputs = arms[arm]["sim_inputs"]
    sched = inputs["scheduler"]
    groups, batches = int(sched["groups_per_batch"]), int(sched["num_batches"])
    base = int(sched.get("seed", 0))
    naive = [simulate_arm(report, arms["naive"]["sim_inputs"], {"seed": base + k},
                          prefix_cache=_routed(arms["naive"]))[1] for k in range(seeds)]
    rows = []
    for cell in _cells(groups, batches):
        sims = [simulate_arm(report, inputs, {**cell, "seed": base + k},
                             prefix_cache=_routed(arms[arm]))[1] for k in range(seeds)]
        ratios = [s["time_per_batch_s"] / n["time_per_batch_s"] for s, n in zip(sims, naive,
                                                                                   strict=True)]
        row = {**cell, "time_per_batch_s": sims[0]["time_per_batch_s"],
               "ratio_vs_naive": round(ratios[0], 3), "launched": sims[0]["launched"],
               "waste_share_of_launched": sims[0]["waste_share_of_launched"],
               "waste_share_of_sandbox_s": sims[0]["waste_share_of_sandbox_s"]}
        if seeds > 1:
            w = [s["waste_share_of_launched"] for s in sims]
            ws = [s["waste_share_of_sandbox_s"] for s in sims]
            row["over_seeds"] = {
                "seeds": seeds, "ratio_median": round(statistics.median(ratios), 3),
                "ratio_max": round(max(ratios), 3),
                "waste_share_of_launched_median": round(statistics.median(w), 3),
                "waste_share_of_launched_max": round(max(w), 3),
                "waste_share_of_sandbox_s_median": round(statistics.median(ws), 3)}
        rows.append(row)
    return rows


ABLATIONS: dict[str, dict[str, Any]] = {
    "no_episode_budget": {"budgets": {}},
    "no_close_cost": {"close_s": 0.0},
    "no_turn_overhead": {"turn_overhead_s": 0.0},
    "no_call_overhead": {"call_s": 0.0},
    "no_setup_cost": {"setup_s": 0.0},
    "plans_only": {"budgets": {}, "close_s": 0.0, "turn_overhead_s": 0.0, "call_s": 0.0,
                   "setup_s": 0.0, "verify_s": 0.0},
}


def ablations(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per arm, the error with one measured input left out (what each is worth)."""
    out: dict[str, dict[str, float]] = {}
    for name, arm in report.get("arms", {}).items():
        if "error" in arm:
            continue
        meas = float(arm["time_per_batch_s"])
        inputs = arm["sim_inputs"]
        row = {}
        for label, change in ABLATIONS.items():
            costs = {**inputs["costs"], **{k: v for k, v in change.items() if k != "budgets"}}
            ins = {**inputs, **({"budgets": {}} if "budgets" in change else {})}
            _, sim = simulate_arm(report, ins, costs=ArmCosts.from_dict(costs),
                                  prefix_cache=_routed(arm))
            row[label] = round((sim["time_per_batch_s"] - meas) / meas, 4)
        out[name] = row
    return out


def from_measured_main(args: argparse.Namespace) -> dict[str, Any]:
    """``--from-measured`` without ``--at-size`` (that one is :mod:`.schedule_predict`)."""
    path = Path(args.from_measured)
    report = load_measured(path)
    out: dict[str, Any] = {
        "benchmark": "schedule vs measured (virtual time on a measured run's inputs)",
        "measured": str(path), "command": report.get("command"),
        "engine": report.get("engine"), "size": report.get("size"),
        **compare(report),
        "error_without": ablations(report),
    }
    if report.get("repeats"):
        out["repeats"] = per_repeat(report)
    if (report.get("engine") or {}).get("token_scale"):
        out["what_if_no_kv_read"] = what_if_no_kv_read(report)
    if getattr(args, "what_if_verifier_slots", None):
        out["what_if_verifier_slots"] = what_if_verifiers(report, args.what_if_verifier_slots)
    if args.sweep:
        out["sweep"] = sweep(report, seeds=max(1, args.sweep_seeds))
    return out


def what_if_verifiers(report: dict[str, Any], slots: int) -> dict[str, Any]:
    """Every arm on its measured inputs with ``slots`` verifier slots instead of the host's:
    simulated time per batch, waste, and the ratio to the naive arm simulated alike."""
    arms = {name: simulate_arm(report, arm["sim_inputs"], {"verifier_slots": slots},
                               prefix_cache=_routed(arm))[1]
            for name, arm in report.get("arms", {}).items() if "error" not in arm}
    naive = arms.get("naive", {}).get("time_per_batch_s")
    return {"verifier_slots": slots, "arms": {
        k: {"time_per_batch_s": a["time_per_batch_s"], "launched": a["launched"],
            "waste_share_of_launched": a["waste_share_of_launched"],
            "ratio_vs_naive": round(a["time_per_batch_s"] / naive, 3) if naive else None}
        for k, a in arms.items()}}


def what_if_no_kv_read(report: dict[str, Any]) -> dict[str, Any]:
    """Long-context runs: every arm on its measured inputs with decode steps that do not read
    the contexts' KV (the engine's per-context term zeroed), against naive simulated alike;
    what the KV read costs each lever (e.g. cache-aware routing keeping a group's long
    contexts on one server)."""
    arms = {name: simulate_arm(report, arm["sim_inputs"], prefix_cache=_routed(arm),
                               kv_read=False)[1]
            for name, arm in report.get("arms", {}).items() if "error" not in arm}
    naive = arms.get("naive", {}).get("time_per_batch_s")
    return {"arms": {
        k: {"time_per_batch_s": a["time_per_batch_s"],
            "ratio_vs_naive": round(a["time_per_batch_s"] / naive, 3) if naive else None}
        for k, a in arms.items()}}


def per_repeat(report: dict[str, Any]) -> list[dict[str, Any]]:
    """``bench collect --repeats N``: every repeat's arms simulated on their own measured
    inputs (each repeat's costs are the host as that repeat saw it), with the order they ran
    in; ``arms`` at the top level are repeat 0's."""
    out = []
    for rep in report["repeats"]:
        arms = {k: a for k, a in rep.get("arms", {}).items() if "sim_inputs" in a
                and "error" not in a and "error" not in a["sim_inputs"]}
        out.append({"repeat": rep.get("repeat"), "order": rep.get("order"),
                    **compare({**report, "arms": arms})})
    return out
