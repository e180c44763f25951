"""`rollbank bench schedule --from-measured FILE.json --at-size G,N,B`: a measured run's inputs
at another size (prediction, not a fit).

Each arm's measured per-attempt costs, task sequence, trace workload and budgets are kept; the
scheduler's size is replaced (G groups of N per batch, a window of B batches, ``--at-slots``
sandbox slots; the bank arms get G' = ``--at-pool`` (default 2 G) and a launch cap of B x G +
``--at-spare`` groups (default ceil(G/4)), as ``bench collect --engine accel-sim`` would run
them). :func:`predict` simulates every arm over seeds (the real scheduler in virtual time) and
reports time per batch, ratio vs naive and waste, and the lower-bound terms at that size from
the plans and costs alone (:func:`bounds`):

- ``verifier_work_s``: G x N x the verifier run / verifier slots, per batch (every arm);
- ``sandbox_work_s``: the attempts' alone-paths / sandbox slots, per batch;
- ``path_s``: naive, the mean over batches of the slowest group path of the batch's G groups;
  bank arms, the (B x G)-th smallest group path among the cap's groups, / B (all launched at
  once, slots ignored) — the window's critical-path term.

A group path is the slowest sibling's set-up + generate calls alone + tool time (under the
task's budget) + close + verifier run. ``--verify-scale X`` multiplies every arm's verifier run
(the cost a loaded host inflates most) to show where the target breaks;
``--at-hold-extras-for-verifier on|off`` sets the bank arms' gate for extras
(``scheduler.hold_extras_for_verifier``).
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
from pathlib import Path
from typing import Any

from rollbank_bench.schedule_measured import (
    capacity_for,
    episode_model,
    load_measured,
    simulate_arm,
    sweep,
)
from rollbank_bench.sim_inputs import ArmCosts


def parse_size(text: str) -> tuple[int, int, int]:
    from rollbank.errors import UsageError

    try:
        g, n, b = (int(x) for x in text.split(","))
    except ValueError as exc:
        raise UsageError(f"--at-size {text!r}: expected G,N,B (e.g. 32,8,4)") from exc
    if min(g, n, b) < 1:
        raise UsageError(f"--at-size {text!r}: every value must be >= 1")
    return g, n, b


def resize(report: dict[str, Any], groups: int, group_size: int, batches: int, *,
           slots: int | None = None, pool: int | None = None, spare: int | None = None,
           verify_scale: float = 1.0, hold_for_verifier: bool | None = None) -> dict[str, Any]:
    """A copy of ``report`` whose arms' scheduler inputs are at the new size (module notes);
    ``hold_for_verifier`` (None: as measured) sets the bank arms' ``hold_extras_for_verifier``."""
    out = copy.deepcopy(report)
    cap = batches * groups + (math.ceil(groups / 4) if spare is None else spare)
    for arm in out.get("arms", {}).values():
        if "error" in arm:
            continue
        ins = arm["sim_inputs"]
        s = ins["scheduler"]
        bank = s.get("mode") == "optimized"
        s.update({"groups_per_batch": groups, "num_batches": batches,
                  "bank": {**s.get("bank", {}), "group_size": group_size},
                  "pool_groups": min(pool or 2 * groups, cap) if bank else groups,
                  "max_groups": cap if bank else None})
        if slots is not None:
            s["sandbox_slots"] = slots
        if bank and hold_for_verifier is not None:
            s["hold_extras_for_verifier"] = hold_for_verifier
        ins["costs"] = {**ins["costs"], "verify_s": ins["costs"]["verify_s"] * verify_scale}
    return out


def _group_paths(report: dict[str, Any], inputs: dict[str, Any], count: int,
                 seed: int) -> tuple[list[float], list[float]]:
    """(group paths, attempt paths) of the first ``count`` groups, alone (no waits)."""
    from rollbank.episodes.attempt import AttemptKey, AttemptSpec
    from rollbank.scheduling.policy.scheduler import attempt_seed

    costs = ArmCosts.from_dict(inputs["costs"])
    prof = capacity_for(report, costs).profile
    model = episode_model(inputs, costs)
    ids, n = inputs["task_ids"], int(inputs["scheduler"]["bank"]["group_size"])
    groups, attempts = [], []
    for g in range(count):
        paths = []
        for slot in range(n):
            spec = AttemptSpec(AttemptKey(g, slot, 0, f"g{g}"), ids[g % len(ids)],
                               attempt_seed(seed, g, slot), n, 0.0)
            ep = model(spec)
            paths.append(ep.duration_s + ep.verify_s + sum(
                prof.generate_s(t.prompt_tokens, t.tokens, 1) + t.tool_s for t in ep.turns))
        groups.append(max(paths))
        attempts.extend(paths)
    return groups, attempts


def bounds(report: dict[str, Any], inputs: dict[str, Any], seed: int) -> dict[str, float]:
    """The arm's lower-bound terms per batch at its (resized) size (module notes)."""
    s = inputs["scheduler"]
    g, b = int(s["groups_per_batch"]), int(s["num_batches"])
    n = int(s["bank"]["group_size"])
    bank = s.get("mode") == "optimized"
    count = int(s.get("max_groups") or b * g + g) if bank else b * g
    groups, attempts = _group_paths(report, inputs, count, seed)
    if bank:
        path = sorted(groups)[b * g - 1] / b
    else:
        path = statistics.fmean(max(groups[k * g:(k + 1) * g]) for k in range(b))
    verify = float(inputs["costs"]["verify_s"])
    out = {"path_s": path,
           "verifier_work_s": g * n * verify / int(s.get("verifier_slots") or 1),
           "sandbox_work_s": statistics.fmean(attempts) * g * n / int(s["sandbox_slots"])}
    out["t_lb_s"] = max(out.values())
    return {k: round(v, 2) for k, v in out.items()}


def predict(report: dict[str, Any], seeds: int = 4) -> dict[str, Any]:
    """Every arm of a (resized) report simulated over ``seeds`` scheduler seeds, with its
    bound terms (seed 0) and, for each arm but naive, ratios vs naive on the same seeds."""
    arms: dict[str, Any] = {}
    for name, arm in report.get("arms", {}).items():
        if "error" in arm:
            continue
        ins = arm["sim_inputs"]
        base = int(ins["scheduler"].get("seed", 0))
        sims = [simulate_arm(report, ins, {"seed": base + k})[1] for k in range(seeds)]
        arms[name] = {
            "scheduler": {k: ins["scheduler"].get(k) for k in (
                "groups_per_batch", "num_batches", "pool_groups", "max_groups",
                "sandbox_slots", "verifier_slots")},
            "time_per_batch_s": [x["time_per_batch_s"] for x in sims],
            "time_per_batch_median_s": round(statistics.median(
                x["time_per_batch_s"] for x in sims), 2),
            "waste_share_of_launched": [x["waste_share_of_launched"] for x in sims],
            "waste_share_of_sandbox_s": [x["waste_share_of_sandbox_s"] for x in sims],
            "verifier_wait_s": [x["verifier_wait_s"] for x in sims],
            "bounds": bounds(report, ins, base), "verify_s": ins["costs"]["verify_s"]}
    naive = arms.get("naive")
    if naive:
        for name, a in arms.items():
            if name == "naive":
                continue
            r = [t / n for t, n in zip(a["time_per_batch_s"], naive["time_per_batch_s"],
                                       strict=True)]
            a["ratio_vs_naive"] = {"median": round(statistics.median(r), 3),
                                   "min": round(min(r), 3), "max": round(max(r), 3)}
            a["bound_ratio_vs_naive"] = round(a["bounds"]["t_lb_s"]
                                              / naive["bounds"]["t_lb_s"], 3)
    return {"seeds": seeds, "arms": arms}


def predict_main(args: argparse.Namespace) -> dict[str, Any]:
    """``--from-measured FILE --at-size G,N,B``: the measured run resized, then predicted."""
    path = Path(args.from_measured)
    g, n, b = parse_size(args.at_size)
    hold = getattr(args, "at_hold_extras_for_verifier", "measured")
    report = resize(load_measured(path), g, n, b, slots=args.at_slots, pool=args.at_pool,
                    spare=args.at_spare, verify_scale=args.verify_scale,
                    hold_for_verifier=None if hold == "measured" else hold == "on")
    pred: dict[str, Any] = {
        "benchmark": "schedule prediction (virtual time on a measured run's inputs, resized)",
        "measured": str(path), "engine": report.get("engine"),
        "at_size": {"groups": g, "group_size": n, "batches": b, "sandbox_slots":
                    args.at_slots, "pool": args.at_pool, "spare": args.at_spare,
                    "verify_scale": args.verify_scale, "hold_extras_for_verifier": hold},
        **predict(report, seeds=max(1, args.sweep_seeds))}
    if args.sweep:
        pred["sweep"] = sweep(report, seeds=max(1, args.sweep_seeds))
    return pred
