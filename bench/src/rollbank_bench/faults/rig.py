"""The campaign's rig and one collection round, shared by the campaign and the fault soak.

:func:`open_rig` brings up everything a faulted collection needs: accel-sim engine processes
(:mod:`.engines`) behind the fault proxy (:mod:`.proxy`), the collector's inference plane on
the proxy's URLs, real bubblewrap sandboxes (warm) wrapped by the injector (:mod:`.inject`),
the campaign tasks (:mod:`.tasks`) and one seeded :class:`.kinds.FaultSchedule` with its
:class:`.inject.FaultLog`. :func:`run_round` runs one collection on it (a fresh run folder and
scheduler seed) and returns its verdicts and checks (:mod:`.campaign` judges them); an *agent
round* (``agents=True``) collects with ``harness = "agent"``: the scripted agent program
(:mod:`.agents`) behind rollbank's gateway, its faults from the rig's agent schedule.
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

from rollbank.metrics.events import read_events
from rollbank_bench.faults.agent_proxy import AgentFaultProxy
from rollbank_bench.faults.agents import (
    AGENT_TIMEOUT_S,
    ENTRY,
    AgentFaults,
    install,
    write_model_folder,
)
from rollbank_bench.faults.checks import Verdict, check_ledger
from rollbank_bench.faults.engines import KillableEngines
from rollbank_bench.faults.inject import FaultingSource, FaultLog
from rollbank_bench.faults.kinds import (
    AGENT_KINDS,
    PER_ATTEMPT,
    VERIFIER_KINDS,
    FaultSchedule,
    selected,
)
from rollbank_bench.faults.script import ScriptedWorkload
from rollbank_bench.faults.tasks import write_tasks
from rollbank_bench.faults.verdicts import Round, verdicts


def campaign_config(args: argparse.Namespace, out: Path, urls: list[str], task_root: Path,
                    seed: int, agent_model: Path | None = None) -> Any:
    """The round's collect config; ``agent_model`` (the template's model folder): an agent
    round (``harness = "agent"``, the scripted agent program)."""
    from rollbank.collect_config import load_collect_config

    agents: dict[str, object] = {} if agent_model is None else {
        "harness": "agent", "agent.entry": ENTRY, "agent.timeout_s": AGENT_TIMEOUT_S,
        "agent.probe_timeout_s": 10.0, "inference.tokenizer": str(agent_model)}
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
        "metrics.report": False, **agents,
    })


@dataclass
class Rig:
    """The live parts of a faulted collection (see module doc)."""

    engines: KillableEngines
    proxy: AgentFaultProxy
    plane: Any  # the inference plane (open_inference)
    sandboxes: Any  # the sandbox plane as opened (its source unwrapped)
    source: FaultingSource
    faulty: Any  # SandboxPlane(source, verifier): what the collector gets
    tasks: list[Any]
    schedule: FaultSchedule
    log: FaultLog
    task_root: Path
    #: agent rounds: their schedule (agent kinds only) and the template's model folder
    agent_schedule: FaultSchedule | None = None
    agent_model: Path | None = None
    agents_only: bool = False  # no harness or verifier kind selected: every round an agent one

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
    from rollbank.inference_plane import open_inference, vocab_size
    from rollbank.task_selection import select_tasks

    kinds = selected(getattr(args, "kinds", None))
    schedule = FaultSchedule(args.seed, args.rate, tuple(k for k in PER_ATTEMPT if k in kinds))
    log = FaultLog()
    agent_kinds = tuple(k for k in AGENT_KINDS if k in kinds)
    # its own seed stream: an agent round's attempt seeds repeat a harness round's otherwise
    agent_schedule = FaultSchedule(args.seed + 7919, args.rate, agent_kinds) if agent_kinds else None
    task_root = out / "tasks"
    await asyncio.to_thread(write_tasks, task_root, clean=args.clean_tasks,
                            verifier_faults=any(k in kinds for k in VERIFIER_KINDS))
    tiny = await asyncio.to_thread(ensure_model, "tiny")
    tok = await asyncio.to_thread(load_tokenizer, tiny)
    agent_model = (await asyncio.to_thread(write_model_folder, out / "agent-model", tiny)
                   if agent_schedule is not None else None)
    async with contextlib.AsyncExitStack() as stack:
        engines = await stack.enter_async_context(KillableEngines(
            args.accelsim_profile, args.engines, vocab_size=vocab_size(tok), max_model_len=4096,
            log_dir=out / "engines"))
        proxy = AgentFaultProxy([(engines.host, p) for p in engines.ports], schedule, log,
                                base_seed=args.seed, restart=engines.restart, kill=engines.kill)
        await stack.enter_async_context(proxy)
        cfg0 = await asyncio.to_thread(campaign_config, args, out / "round-000", proxy.urls,
                                       task_root, args.seed)
        tasks = await asyncio.to_thread(select_tasks, cfg0)
        plane = await stack.enter_async_context(open_inference(cfg0.inference, max_model_len=2048))
        sandboxes = await stack.enter_async_context(open_sandboxes(cfg0.sandbox, tasks, prepare=tasks))
        source = FaultingSource(sandboxes.source, schedule, log)
        stack.push_async_callback(source.aclose)
        if agent_schedule is not None:
            stack.enter_context(install(AgentFaults(agent_schedule, log, proxy)))
        yield Rig(engines, proxy, plane, sandboxes, source, SandboxPlane(source, sandboxes.verifier),
                  tasks, schedule, log, task_root, agent_schedule, agent_model,
                  agents_only=not any(k in kinds for k in PER_ATTEMPT + VERIFIER_KINDS))


def agent_round(rig: Rig, r: int) -> bool:
    """Whether round ``r`` is an agent round: every other one when the rig injects both agent
    and harness kinds, every one when it injects agent kinds only."""
    if rig.agent_schedule is None:
        return False
    return r % 2 == 1 or rig.agents_only


@dataclass
class RoundResult:
    """One round's summary row, its fault verdicts, clean-attempt tally and check errors."""

    row: dict[str, Any]
    verdicts: list[Verdict]
    clean: dict[str, Any]
    errors: list[str] = field(default_factory=list)


async def run_round(rig: Rig, args: argparse.Namespace, out: Path, r: int, *,
                    agents: bool = False) -> RoundResult:
    """Collect round ``r`` (``args.batches_per_round`` batches, seed ``args.seed + 1000 (r+1)``)
    into ``out/round-NNN`` and judge it; ``agents``: an agent round (the rig must have an
    agent schedule)."""
    from rollbank.collector import collect

    seed = args.seed + 1000 * (r + 1)
    rig.proxy.base_seed = seed
    run_dir = out / f"round-{r:03d}"
    schedule = rig.agent_schedule if agents else rig.schedule
    if schedule is None:
        raise ValueError("an agent round on a rig without agent kinds")
    cfg = await asyncio.to_thread(campaign_config, args, run_dir, rig.proxy.urls, rig.task_root,
                                  seed, rig.agent_model if agents else None)
    rnd = Round(r, seed)
    start, windows_before = len(rig.log.items), len(rig.proxy.windows)
    tr = time.monotonic()
    res = await collect(cfg, tasks=rig.tasks, inference=rig.plane, sandboxes=rig.faulty,
                        out_dir=run_dir, on_batch=rnd.on_batch_checker(cfg),
                        workload=None if agents else ScriptedWorkload(rig.schedule))
    rnd.trajectories = res.trajectories
    events = await asyncio.to_thread(read_events, res.out_dir / "events.jsonl")
    launched = sum(1 for e in events if e.get("kind") == "launched")
    errs = rnd.batch_errors + check_ledger(res.ledger, res.trajectories, launched)
    windows = (bool(rig.proxy.collateral) or len(rig.proxy.windows) > windows_before
               or bool(rig.proxy.down))
    vs, clean = verdicts(rnd, rig.log, start, schedule, windows,
                         rig.proxy.collateral_attempts(), rig.proxy.down_intervals())
    row = {"round": r, "seed": seed, "agents": agents, "s": round(time.monotonic() - tr, 1),
           "batches": len(res.batches), "groups_checked": rnd.groups,
           "attempts": len(res.trajectories), "faults": len(vs),
           "ledger": {k: v for k, v in res.ledger.items() if k != "unreachable"}, "errors": errs}
    return RoundResult(row, vs, clean, errs)
