"""The in-process phase: a collection on real sandboxes, verifiers and engine processes with
faults injected (everything but the collector kill, :mod:`.crash`).

Path: accel-sim engine processes (:mod:`.engines`) <- fault proxy (:mod:`.proxy`) <- the
collector's real clients, router, scheduler, ready bank and batch writer
(``collector.collect``) <- real bubblewrap sandboxes forked from warm snapshots, wrapped by
the injector (:mod:`.inject`) <- the scripted policy (:mod:`.script`) and the real verifiers
(campaign tasks, :mod:`.tasks`). Collected in rounds (a fresh run folder and scheduler seed
each) until the target number of faults is injected.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

from rollbank.batching.batch import Batch
from rollbank.bench.faults.checks import (
    Verdict,
    check_group,
    check_ledger,
    confounder,
    may_be_confounded,
    verdict,
)
from rollbank.bench.faults.crash import run_kills
from rollbank.bench.faults.engines import KillableEngines
from rollbank.bench.faults.inject import FaultingSource, FaultLog
from rollbank.bench.faults.kinds import (
    EXPECT,
    PER_ATTEMPT,
    VERIFIER_KINDS,
    FaultKind,
    FaultSchedule,
    Via,
)
from rollbank.bench.faults.proxy import FaultProxy
from rollbank.bench.faults.script import ScriptedWorkload
from rollbank.bench.faults.tasks import task_id_kind, write_tasks
from rollbank.episodes.spans import SPANS_KEY
from rollbank.episodes.trajectory import Trajectory
from rollbank.metrics.events import read_events


def campaign_config(args: argparse.Namespace, out: Path, urls: list[str], task_root: Path,
                    seed: int) -> Any:
    from rollbank.collect_config import load_collect_config

    return load_collect_config(None, {
        "tasks": [str(task_root)], "exclude_costs": [], "include": [], "output": str(out),
        "runner.step_timeout_s": args.step_timeout, "runner.step_timeout_ends_episode": True,
        "runner.episode_budget_s": None, "runner.max_model_len": 2048,
        "runner.verifier_slots": 2,
        "sandbox.warm": True, "sandbox.local.max_host_stall_s": args.max_host_stall,
        "sandbox.local.max_processes": 64,
        "scheduler.mode": "optimized", "scheduler.groups_per_batch": args.groups,
        "scheduler.pool_groups": args.pool_groups, "scheduler.straggler": "carry",
        "scheduler.sandbox_slots": args.sandbox_slots, "scheduler.inference_slots_per_server": 8,
        "scheduler.num_batches": args.batches_per_round, "scheduler.seed": seed,
        "scheduler.bank.group_size": args.group_size, "scheduler.bank.max_retries": 2,
        "scheduler.bank.dynamic_sampling.enabled": False,
        "task_order_seed": seed, "router.policy": "round_robin",
        "inference.kind": "external", "inference.urls": urls, "inference.tokenizer": "tiny",
        "inference.calibrate": False, "metrics.live": "off", "metrics.record_episodes": True,
        "metrics.report": False,
    })


class Round:
    """Verdicts and checks of one collection round."""

    def __init__(self, index: int, seed: int) -> None:
        self.index, self.seed = index, seed
        self.batch_errors: list[str] = []
        self.groups = 0
        self.trajectories: list[Trajectory] = []

    def on_batch_checker(self, cfg: Any) -> Any:
        async def check(batch: Batch, path: Path) -> None:
            for g in batch.groups:
                self.groups += 1
                self.batch_errors += check_group(g, cfg.scheduler.bank.advantages,
                                                 cfg.scheduler.bank.min_valid)
        return check


def _run_in(trajs: list[Trajectory], seed: int, sandbox: object) -> Trajectory | None:
    """The attempt whose episode ran in ``sandbox`` (a slot's retries share the seed, and the
    fault lands on whichever run reaches its fault turn first)."""
    for t in trajs:
        if t.seed == seed and any(s.get("kind") == "episode" and s.get("sandbox") == sandbox
                                  for s in t.meta.get(SPANS_KEY, [])):
            return t
    return None


def verdicts(rnd: Round, log: FaultLog, start: int, schedule: FaultSchedule,
             windows: bool, collateral: set[str]) -> tuple[list[Verdict], dict[str, Any]]:
    """Every fault of the round with its attempt's outcome, and the clean attempts' tally."""
    out = _verdicts(rnd, log, start, schedule, windows)
    by_id = {t.trajectory_id: t for t in rnd.trajectories}
    for v in out[0]:
        if may_be_confounded(v.kind) and v.attempt_id is not None:
            v.confounded = confounder(by_id.get(v.attempt_id), collateral)
    return out


def _verdicts(rnd: Round, log: FaultLog, start: int, schedule: FaultSchedule,
              windows: bool) -> tuple[list[Verdict], dict[str, Any]]:
    trajs = rnd.trajectories
    by_id = {t.trajectory_id: t for t in trajs}
    out: list[Verdict] = []
    for inj in log.items[start:]:
        if inj.attempt_id is not None:
            out.append(verdict(inj.kind, by_id.get(inj.attempt_id), attempt_id=inj.attempt_id, **inj.detail))
        elif inj.seed is not None:
            out.append(verdict(inj.kind, _run_in(trajs, inj.seed, inj.detail.get("sandbox")),
                               seed=inj.seed, **inj.detail))
    faulted = {v.attempt_id for v in out}
    clean: dict[str, Any] = {"attempts": 0, "trainable": 0, "collateral_inference_error": 0,
                             "unexplained": []}
    for t in trajs:
        planned = schedule.planned(t.seed)
        vkind = task_id_kind(t.task_id)
        if vkind is not None:
            out.append(verdict(vkind, t))
            continue
        if planned is not None and EXPECT[planned.kind].via is Via.MODEL:
            out.append(verdict(planned.kind, t))
            continue
        if t.trajectory_id in faulted:
            continue
        clean["attempts"] += 1
        o = t.outcome
        if o is not None and o.outcome.trainable:
            clean["trainable"] += 1
        elif o is not None and o.reason.value == "inference_error" and windows:
            clean["collateral_inference_error"] += 1
        else:
            clean["unexplained"].append({"attempt_id": t.trajectory_id,
                                         "outcome": o.outcome.value if o else None,
                                         "reason": o.reason.value if o else None,
                                         "planned": planned.kind.value if planned else None})
    return out, clean


async def run_phase(args: argparse.Namespace, out: Path, target: int, kills: int) -> dict[str, Any]:
    from rollbank.collector import collect
    from rollbank.episodes.sandboxes import open_sandboxes
    from rollbank.episodes.sources import SandboxPlane
    from rollbank.inference.models import ensure_model
    from rollbank.inference.tokenizer import load_tokenizer
    from rollbank.inference_plane import _vocab_size, open_inference
    from rollbank.task_selection import select_tasks

    schedule = FaultSchedule(args.seed, args.rate)
    log = FaultLog()
    task_root = out / "tasks"
    write_tasks(task_root, clean=args.clean_tasks, verifier_faults=True)
    tok = load_tokenizer(await asyncio.to_thread(ensure_model, "tiny"))
    rounds: list[dict[str, Any]] = []
    all_verdicts: list[Verdict] = []
    errors: list[str] = []
    clean_total: dict[str, Any] = {"attempts": 0, "trainable": 0, "collateral_inference_error": 0,
                                   "unexplained": []}
    t0 = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        engines = await stack.enter_async_context(KillableEngines(
            args.accelsim_profile, args.engines, vocab_size=_vocab_size(tok), max_model_len=4096,
            log_dir=out / "engines"))
        proxy = await stack.enter_async_context(FaultProxy(
            [(engines.host, p) for p in engines.ports], schedule, log, base_seed=args.seed,
            restart=engines.restart, kill=engines.kill))
        cfg0 = campaign_config(args, out / "round-000", proxy.urls, task_root, args.seed)
        tasks = select_tasks(cfg0)
        plane = await stack.enter_async_context(open_inference(cfg0.inference, max_model_len=2048))
        sandboxes = await stack.enter_async_context(open_sandboxes(cfg0.sandbox, tasks, prepare=tasks))
        source = FaultingSource(sandboxes.source, schedule, log)
        stack.push_async_callback(source.aclose)
        faulty = SandboxPlane(source, sandboxes.verifier)
        r = 0
        def more() -> bool:
            missing = set(PER_ATTEMPT + VERIFIER_KINDS) - {v.kind for v in all_verdicts}
            return (len(all_verdicts) < target or bool(missing)) and r < args.max_rounds

        while more():
            seed = args.seed + 1000 * (r + 1)
            proxy.base_seed = seed
            cfg = campaign_config(args, out / f"round-{r:03d}", proxy.urls, task_root, seed)
            rnd = Round(r, seed)
            start, windows_before = len(log.items), len(proxy.windows)
            tr = time.monotonic()
            res = await collect(cfg, tasks=tasks, inference=plane, sandboxes=faulty,
                                out_dir=out / f"round-{r:03d}", on_batch=rnd.on_batch_checker(cfg),
                                workload=ScriptedWorkload(schedule))
            rnd.trajectories = res.trajectories
            launched = sum(1 for e in read_events(res.out_dir / "events.jsonl") if e.get("kind") == "launched")
            errs = rnd.batch_errors + check_ledger(res.ledger, res.trajectories, launched)
            vs, clean = verdicts(rnd, log, start, schedule, bool(proxy.collateral) or
                                 len(proxy.windows) > windows_before or bool(proxy.down),
                                 proxy.collateral_attempts())
            all_verdicts += vs
            errors += [f"round {r}: {e}" for e in errs]
            for k in ("attempts", "trainable", "collateral_inference_error"):
                clean_total[k] += clean[k]
            clean_total["unexplained"] += clean["unexplained"]
            rounds.append({"round": r, "seed": seed, "s": round(time.monotonic() - tr, 1),
                           "batches": len(res.batches), "groups_checked": rnd.groups,
                           "attempts": len(res.trajectories), "faults": len(vs),
                           "ledger": {k: v for k, v in res.ledger.items() if k != "unreachable"},
                           "errors": errs})
            r += 1
        crash_tasks = out / "crash-tasks"
        write_tasks(crash_tasks, clean=2, verifier_faults=False)
        tk = time.monotonic()
        crashes = await run_kills(kills, out / "crash", engines.urls, crash_tasks, args.seed)
        all_verdicts += crashes["verdicts"]
        errors += crashes["errors"]
        kill_s = round(time.monotonic() - tk, 1)
    return {"kill_phase_s": kill_s,"verdicts": all_verdicts, "errors": errors, "rounds": rounds, "clean": clean_total,
            "injector_errors": source.errors, "proxy": {"collateral": len(proxy.collateral),
                                                        "windows": proxy.windows},
            "seconds": round(time.monotonic() - t0, 1),
            "engine": {"kind": "accel-sim", "profile": args.accelsim_profile, "processes": args.engines,
                       "note": "benchmark instrument: separate HTTP server processes speaking "
                       "vLLM's API at ~no CPU (rollbank.bench.accelsim), so the campaign fits on 2 "
                       "cores; sandboxes, verifiers, clients, router, scheduler and writer are real"}}


__all__ = ["FaultKind", "run_phase"]
