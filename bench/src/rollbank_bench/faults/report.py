"""Runs the campaign and assembles its JSON: faults by kind, checks, leaks."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
from typing import Any

from rollbank_bench.faults.checks import by_kind
from rollbank_bench.faults.kinds import EXPECT, KNOWN_LIMITS, FaultKind, selected


def _quick(args: argparse.Namespace) -> None:
    args.faults = 24
    args.collector_kills = 1 if args.collector_kills is None else args.collector_kills
    args.rate = 0.8
    args.groups, args.group_size, args.pool_groups = 2, 3, 4
    args.batches_per_round, args.max_rounds = 2, 8  # every other round an agent round
    args.clean_tasks = 3
    args.sandbox_slots = 8


def by_via(kinds: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Per place of injection (sandbox, model, verifier, engine, collector, agent): faults
    injected, observed, correctly attributed (sums of ``by_kind``)."""
    out: dict[str, dict[str, int]] = {}
    for kind, row in kinds.items():
        v = out.setdefault(EXPECT[FaultKind(kind)].via.value,
                           {"kinds": 0, "injected": 0, "observed": 0, "correct": 0})
        v["kinds"] += 1
        for k in ("injected", "observed", "correct"):
            v[k] += row[k]
    return out


def summarize(phase: dict[str, Any], leaks: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    verdicts = phase["verdicts"]
    kinds = by_kind(verdicts)
    observed = [v for v in verdicts if v.observed]
    wrong = [{**v.to_dict(), "known_limit": KNOWN_LIMITS.get((v.kind, f"{v.outcome}/{v.reason}")),
              **({"evidence": v.evidence} if v.evidence else {})}
             for v in observed if not v.correct]
    new = [w for w in wrong if w["known_limit"] is None]
    unexplained = phase["clean"]["unexplained"]
    checks = {
        "attribution_correct": not wrong,
        "no_new_misattribution": not new,
        "every_kind_injected": all(kinds[k.value]["injected"] > 0
                                   for k in selected(getattr(args, "kinds", None))),
        "ledger_and_batches_exact": not phase["errors"],
        "clean_attempts_trainable": not unexplained,
        "no_injector_errors": not phase["injector_errors"],
        "no_leaks": not any(v for k, v in leaks.items() if not k.endswith("_examples")),
    }
    return {
        "benchmark": "faults",
        "wall_clock": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "seed": args.seed, "quick": bool(args.quick),
        "kinds": [k.value for k in selected(getattr(args, "kinds", None))],
        "faults_injected": len(verdicts), "faults_observed": len(observed),
        "attributed_correctly": sum(v.correct for v in observed),
        "attribution_rate": round(sum(v.correct for v in observed) / len(observed), 4) if observed else None,
        "by_kind": kinds,
        "by_via": by_via(kinds),
        "expected_by_kind": {k.value: e.why for k, e in EXPECT.items()},
        "misattributed": wrong[:50],
        "misattributed_known_limits": len(wrong) - len(new),
        "misattributed_new": len(new),
        "confounded": sum(v.confounded is not None for v in verdicts),
        "not_observed": [v.to_dict() for v in verdicts if not v.observed][:20],
        "clean_attempts": {**{k: v for k, v in phase["clean"].items() if k != "unexplained"},
                           "unexplained": len(unexplained), "unexplained_examples": unexplained[:20]},
        "ledger_batch_errors": phase["errors"][:50],
        "injector_errors": phase["injector_errors"][:20],
        "injector_missed": phase.get("injector_missed", 0),  # sandbox gone before the fault
        "rounds": phase["rounds"],
        "proxy": phase["proxy"],
        "leaks": leaks,
        "checks": checks,
        "ok": all(checks.values()),
        "engine": phase["engine"],
        "seconds": {"in_process": phase["seconds"], "collector_kills": phase["kill_phase_s"]},
        "size": {"groups": args.groups, "group_size": args.group_size, "pool_groups": args.pool_groups,
                 "rate": args.rate, "target_faults": args.faults,
                 "collector_kills": args.collector_kills, "step_timeout_s": args.step_timeout,
                 "max_host_stall_s": args.max_host_stall},
    }


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    from rollbank_bench.faults.campaign import run_phase
    from rollbank_bench.faults.leaks import leaked, snapshot

    before = await asyncio.to_thread(snapshot)
    phase = await run_phase(args, args.out, args.faults, args.collector_kills)
    gc.collect()
    await asyncio.sleep(0.5)  # let killed children be reaped
    after = await asyncio.to_thread(snapshot)
    return summarize(phase, leaked(before, after), args)


def main(args: argparse.Namespace) -> int:
    if args.quick:
        _quick(args)
    if FaultKind.COLLECTOR_SIGKILL not in selected(args.kinds):
        args.collector_kills = 0
    if args.collector_kills is None:
        args.collector_kills = max(2, args.faults // 50)
    args.out.mkdir(parents=True, exist_ok=True)
    from rollbank.collector import check_output_folder

    for d in sorted(args.out.glob("round-*")):
        check_output_folder(d)  # never mix a new campaign into an old one's folders
    report = asyncio.run(_main(args))
    json.dump(report, sys.stdout, indent=2, default=str)
    print()
    return 0 if report["ok"] else 1
