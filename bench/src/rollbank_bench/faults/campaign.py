"""The in-process phase: a collection on real sandboxes, verifiers and engine processes with
faults injected (everything but the collector kill, :mod:`.crash`).

Path: accel-sim engine processes (:mod:`.engines`) <- fault proxy (:mod:`.proxy`) <- the
collector's real clients, router, scheduler, ready bank and batch writer
(``collector.collect``) <- real bubblewrap sandboxes forked from warm snapshots, wrapped by
the injector (:mod:`.inject`) <- the scripted policy (:mod:`.script`) and the real verifiers
(campaign tasks, :mod:`.tasks`). Collected in rounds (a fresh run folder and scheduler seed
each) until the target number of faults is injected. The rig and one round are in :mod:`.rig`
(shared with the fault soak, ``rollbank bench soak --faults``); the verdicts in :mod:`.verdicts`.
Every other round is an agent round (``harness = "agent"``: the scripted agent program of
:mod:`.agents` behind the gateway, with the agent kinds' faults).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rollbank_bench.faults.checks import Verdict
from rollbank_bench.faults.crash import run_kills
from rollbank_bench.faults.kinds import (
    AGENT_KINDS,
    PER_ATTEMPT,
    VERIFIER_KINDS,
    FaultKind,
    selected,
)
from rollbank_bench.faults.rig import agent_round, open_rig, run_round
from rollbank_bench.faults.tasks import write_tasks


async def run_phase(args: argparse.Namespace, out: Path, target: int, kills: int) -> dict[str, Any]:
    all_verdicts: list[Verdict] = []
    rounds: list[dict[str, Any]] = []
    errors: list[str] = []
    clean_total: dict[str, Any] = {"attempts": 0, "trainable": 0, "collateral_inference_error": 0,
                                   "unexplained": []}
    t0 = time.monotonic()
    wanted = set(PER_ATTEMPT + VERIFIER_KINDS + AGENT_KINDS) & set(selected(getattr(args, "kinds", None)))
    async with open_rig(args, out) as rig:
        r = 0

        def more() -> bool:
            missing = wanted - {v.kind for v in all_verdicts}
            return (len(all_verdicts) < target or bool(missing)) and r < args.max_rounds

        while more():
            res = await run_round(rig, args, out, r, agents=agent_round(rig, r))
            all_verdicts += res.verdicts
            errors += [f"round {r}: {e}" for e in res.errors]
            for k in ("attempts", "trainable", "collateral_inference_error"):
                clean_total[k] += res.clean[k]
            clean_total["unexplained"] += res.clean["unexplained"]
            rounds.append(res.row)
            r += 1
        crash_tasks = out / "crash-tasks"
        write_tasks(crash_tasks, clean=2, verifier_faults=False)
        tk = time.monotonic()
        crashes = await run_kills(kills, out / "crash", rig.engines.urls, crash_tasks, args.seed)
        all_verdicts += crashes["verdicts"]
        errors += crashes["errors"]
        kill_s = round(time.monotonic() - tk, 1)
    return {"kill_phase_s": kill_s, "verdicts": all_verdicts, "errors": errors, "rounds": rounds,
            "clean": clean_total, "injector_errors": rig.source.errors,
            "injector_missed": len(rig.source.missed),
            "proxy": {"collateral": len(rig.proxy.collateral), "windows": rig.proxy.windows},
            "seconds": round(time.monotonic() - t0, 1), "engine": engine_note(args)}


def engine_note(args: argparse.Namespace) -> dict[str, Any]:
    return {"kind": "accel-sim", "profile": args.accelsim_profile, "processes": args.engines,
            "note": "benchmark instrument: separate HTTP server processes speaking "
            "vLLM's API at ~no CPU (rollbank_bench.accelsim), so the campaign fits on 2 "
            "cores; sandboxes, verifiers, clients, router, scheduler and writer are real"}


__all__ = ["FaultKind", "run_phase"]
