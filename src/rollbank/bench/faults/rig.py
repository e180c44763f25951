"""The campaign's rig and one collection round, shared by the campaign and the fault soak.

:func:`open_rig` brings up everything a faulted collection needs: accel-sim engine processes
(:mod:`.engines`) behind the fault proxy (:mod:`.proxy`), the collector's inference plane on
the proxy's URLs, real bubblewrap sandboxes (warm) wrapped by the injector (:mod:`.inject`),
the campaign tasks (:mod:`.tasks`) and one seeded :class:`.kinds.FaultSchedule` with its
:class:`.inject.FaultLog`. :func:`run_round` runs one collection on it (a fresh run folder and
scheduler seed) and returns its verdicts and checks (:mod:`.campaign` judges them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollbank.bench.faults.checks import Verdict, check_ledger
from rollbank.bench.faults.engines import KillableEngines
from rollbank.bench.faults.inject import FaultingSource, FaultLog
from rollbank.bench.faults.kinds import PER_ATTEMPT, VERIFIER_KINDS, FaultSchedule, selected
from rollbank.bench.faults.proxy import FaultProxy
from rollbank.bench.faults.script import ScriptedWorkload
from rollbank.bench.faults.tasks import write_tasks
from rollbank.bench.faults.verdicts import Round, verdicts
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


@dataclass
class Rig:
    """The live parts of a faulted collection (see module doc)."""

    engines: KillableEngines
    proxy: FaultProxy
    plane: Any  # the inference plane (open_inference)
    sandboxes: Any  # the sandbox plane as opened (its source unwrapped)
    source: FaultingSource
    faulty: Any  # SandboxPlane(source, verifier): what the collector gets
    tasks: list[Any]
    schedule: FaultSchedule
    log: FaultLog
    task_root: Path

    def live_sandboxes(self) -> int:
        """Sandboxes alive in the local backend (warm: its pool's backend)."""
        return len(self._backend().sandboxes)

    def _backend(self) -> Any:
        inner: Any = self.sandboxes.source
        return inner.pool.backend if hasattr(inner, "pool") else inner.backend

    def lingering(self) -> list[dict[str, Any]]:
        """The live sandboxes (a drained round should have none), each with the faults the
        injector put into it: who to suspect when a round-end reading is not flat."""
        out = []
        for sb in self._backend().sandboxes:
            hits = [i.kind.value for i in self.log.items if i.detail.get("sandbox") == sb.sandbox_id]
            out.append({"sandbox": sb.sandbox_id, "alive": sb.alive, "faults": hits})
        return out


@contextlib.asynccontextmanager
async def open_rig(args: argparse.Namespace, out: Path) -> AsyncIterator[Rig]:
    from rollbank.episodes.sandboxes import open_sandboxes
    from rollbank.episodes.sources import SandboxPlane
    from rollbank.inference.models import ensure_model
    from rollbank.inference.tokenizer import load_tokenizer
    from rollbank.inference_plane import _vocab_size, open_inference
    from rollbank.task_selection import select_tasks

    kinds = selected(getattr(args, "kinds", None))
    schedule = FaultSchedule(args.seed, args.rate, tuple(k for k in PER_ATTEMPT if k in kinds))
    log = FaultLog()
    task_root = out / "tasks"
    await asyncio.to_thread(write_tasks, task_root, clean=args.clean_tasks,
                            verifier_faults=any(k in kinds for k in VERIFIER_KINDS))
    tok = await asyncio.to_thread(lambda: load_tokenizer(ensure_model("tiny")))
    async with contextlib.AsyncExitStack() as stack:
        engines = await stack.enter_async_context(KillableEngines(
            args.accelsim_profile, args.engines, vocab_size=_vocab_size(tok), max_model_len=4096,
            log_dir=out / "engines"))
        proxy = await stack.enter_async_context(FaultProxy(
            [(engines.host, p) for p in engines.ports], schedule, log, base_seed=args.seed,
            restart=engines.restart, kill=engines.kill))
        cfg0 = await asyncio.to_thread(campaign_config, args, out / "round-000", proxy.urls,
                                       task_root, args.seed)
        tasks = await asyncio.to_thread(select_tasks, cfg0)
        plane = await stack.enter_async_context(open_inference(cfg0.inference, max_model_len=2048))
        sandboxes = await stack.enter_async_context(open_sandboxes(cfg0.sandbox, tasks, prepare=tasks))
        source = FaultingSource(sandboxes.source, schedule, log)
        stack.push_async_callback(source.aclose)
        yield Rig(engines, proxy, plane, sandboxes, source, SandboxPlane(source, sandboxes.verifier),
                  tasks, schedule, log, task_root)


@dataclass
class RoundResult:
    """One round's summary row, its fault verdicts, clean-attempt tally and check errors."""

    row: dict[str, Any]
    verdicts: list[Verdict]
    clean: dict[str, Any]
    errors: list[str] = field(default_factory=list)


async def run_round(rig: Rig, args: argparse.Namespace, out: Path, r: int) -> RoundResult:
    """Collect round ``r`` (``args.batches_per_round`` batches, seed ``args.seed + 1000 (r+1)``)
    into ``out/round-NNN`` and judge it."""
    from rollbank.collector import collect

    seed = args.seed + 1000 * (r + 1)
    rig.proxy.base_seed = seed
    run_dir = out / f"round-{r:03d}"
    cfg = await asyncio.to_thread(campaign_config, args, run_dir, rig.proxy.urls, rig.task_root, seed)
    rnd = Round(r, seed)
    start, windows_before = len(rig.log.items), len(rig.proxy.windows)
    tr = time.monotonic()
    res = await collect(cfg, tasks=rig.tasks, inference=rig.plane, sandboxes=rig.faulty,
                        out_dir=run_dir, on_batch=rnd.on_batch_checker(cfg),
                        workload=ScriptedWorkload(rig.schedule))
    rnd.trajectories = res.trajectories
    events = await asyncio.to_thread(read_events, res.out_dir / "events.jsonl")
    launched = sum(1 for e in events if e.get("kind") == "launched")
    errs = rnd.batch_errors + check_ledger(res.ledger, res.trajectories, launched)
    windows = (bool(rig.proxy.collateral) or len(rig.proxy.windows) > windows_before
               or bool(rig.proxy.down))
    vs, clean = verdicts(rnd, rig.log, start, rig.schedule, windows,
                         rig.proxy.collateral_attempts(), rig.proxy.down_intervals())
    row = {"round": r, "seed": seed, "s": round(time.monotonic() - tr, 1),
           "batches": len(res.batches), "groups_checked": rnd.groups,
           "attempts": len(res.trajectories), "faults": len(vs),
           "ledger": {k: v for k, v in res.ledger.items() if k != "unreachable"}, "errors": errs}
    return RoundResult(row, vs, clean, errs)
