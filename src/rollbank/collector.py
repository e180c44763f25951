"""The collector: tasks -> sandboxes -> servers -> router -> scheduler driver -> batches.

:func:`collect` runs one collection with already-opened planes (inference servers, sandbox
source + verifier) so that a benchmark can run several arms against the same servers;
:func:`run_collect` opens the planes a :class:`CollectConfig` describes and calls it.

Output folder (``config.output``)::

    config.resolved.json   the resolved configuration
    events.jsonl           every lifecycle event (metrics/events.py)
    batches/batch-NNNNNN/  trainable batches (batching/writer.py), manifest with the summary
    episodes/*.json        one replayable episode file per attempt (episodes/replay.py)
    summary.json           per-batch metrics, lower bound, capacity, run totals
    report.html            plots (metrics/report.py)

Invariants
- Every process and sandbox started for the run is released when :func:`run_collect` returns
  or raises (``AsyncExitStack``); no task outlives it (the driver's TaskGroup).
- Summaries are computed from the trajectories the runner returned and the spans they carry.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollbank.batching.batch import Batch
from rollbank.batching.writer import write_batch
from rollbank.clock import Clock, MonotonicClock
from rollbank.collect_config import CollectConfig, make_harness_for
from rollbank.config import dump_resolved
from rollbank.episodes.replay import EpisodeRecorder
from rollbank.episodes.runner import EpisodeRunner
from rollbank.episodes.sources import SandboxPlane
from rollbank.episodes.trajectory import Trajectory
from rollbank.episodes.workload import TraceWorkload, make_workload
from rollbank.errors import InputError
from rollbank.extras import require
from rollbank.inference_plane import InferencePlane, calibrate_plane, open_inference
from rollbank.memory import release_freed_memory
from rollbank.metrics.bound import Capacity
from rollbank.metrics.events import EventLog, read_events
from rollbank.metrics.progress import (
    PREFIX,
    PlainProgress,
    progress_sink,
    run_summary_lines,
    wants_live,
    zero_variance_extra,
    zero_variance_share,
)
from rollbank.metrics.summary import BatchSummary, summarize_batch
from rollbank.resume import ResumePlan, write_record
from rollbank.routing.factory import router_from_config
from rollbank.routing.router import Router
from rollbank.scheduling.drivers.driver import CollectionDriver
from rollbank.scheduling.drivers.gated_driver import collection_driver
from rollbank.scheduling.drivers.scoring import PolicyScorer
from rollbank.scheduling.policy.events import EventSink, FanoutSink
from rollbank.scheduling.policy.types import AttemptSpec
from rollbank.task_selection import select_tasks, task_sequence, tasks_to_prepare
from rollbank.tasks.model import Task

if TYPE_CHECKING:
    from rollbank.agents.plane import AgentPlane


@dataclass
class CollectResult:
    out_dir: Path
    batches: list[BatchSummary]
    trajectories: list[Trajectory]
    capacity: Capacity | None
    t0: float  # first launch (collector clock)
    t_end: float  # last batch handed over
    setup_s: float  # planes opened before the clock started (servers, warm pool), if known
    ledger: dict[str, Any] = field(default_factory=dict)
    groups: dict[str, Any] = field(default_factory=dict)  # every complete group (HoldCounts)

    @property
    def collection_s(self) -> float:
        return self.t_end - self.t0


class _Keeping:
    """An AttemptRunner that keeps every trajectory its inner runner returns."""

    def __init__(self, inner: EpisodeRunner) -> None:
        self.inner = inner
        self.finished: list[Trajectory] = []

    async def run(self, attempt: AttemptSpec) -> Trajectory:
        traj = await self.inner.run(attempt)
        self.finished.append(traj)
        return traj


def plain_printer(config: CollectConfig) -> Callable[[str], None] | None:
    """Plain ``[rollbank]`` lines on stderr when the run is not on a terminal (else None)."""
    if config.metrics.live != "auto" or sys.stderr is None or wants_live("auto", sys.stderr):
        return None  # (no stderr: print would fall back to stdout)
    return lambda text: print(f"{PREFIX} {text}", file=sys.stderr, flush=True)


async def collect(
    config: CollectConfig,
    *,
    tasks: Sequence[Task],
    inference: InferencePlane,
    sandboxes: SandboxPlane,
    out_dir: Path,
    capacity: Capacity | None = None,
    clock: Clock | None = None,
    extra_sinks: Sequence[EventSink] = (),
    setup_s: float = 0.0,
    router: Router | None = None,
    on_batch: Callable[[Batch, Path], Awaitable[None]] | None = None,
    resume: ResumePlan | None = None,
    scorer: PolicyScorer | None = None,
    workload: TraceWorkload | None = None,
    write_batches: bool = True,
    batches_ahead: int = 1,
) -> CollectResult:
    """Run one collection with opened planes; write batches, events, episodes, summary.

    ``router`` replaces the one ``config.router`` describes (a trainer tells it about weight
    versions); ``on_batch(batch, path)`` runs after a batch is written, before it is
    acknowledged (``rollbank train`` trains on it there); ``resume`` continues that crashed
    run in ``out_dir`` (``rollbank.resume``); ``scorer`` scores groups for the staleness gate
    (``config.staleness.collection``; default: the engines' prompt log-probs); ``workload``
    replaces the one ``config.workload`` describes (a benchmark's scripted actions:
    ``rollbank bench faults``). ``write_batches=False`` (``rollbank eval``) writes no
    training batch: each batch is acknowledged once summarised (``on_batch`` is not called).
    ``batches_ahead``: batches collection may complete while ``on_batch`` is still busy
    before it waits (``rollbank train`` in async mode: ``loop.max_lag``, its admission gate
    being the bound).
    """
    clock = clock or MonotonicClock()
    if resume is None:
        check_output_folder(out_dir)  # before the first launch, not when the first batch is written
    if config.metrics.report:  # fail before collecting, not after
        require("matplotlib", "report", "metrics.report = true (report.html)")
    if resume is None:
        dump_resolved(config, out_dir)  # creates out_dir
    elif resume.remaining == 0:
        return _nothing_left(resume)
    sched = config.scheduler
    servers = list(inference.clients)
    say = plain_printer(config)
    if capacity is None and config.inference.calibrate:
        capacity = await calibrate_plane(
            inference, sandbox_slots=(sched.sandbox_slots if sandboxes.capacity is None
                                      else sandboxes.capacity.capacity),
            verifier_slots=config.runner.verifier_slots or os.cpu_count(),
            max_age_s=config.inference.calibration_max_age_s, say=say)
    # servers still starting (inference.feed) join the router and the scheduler as they serve
    router = router or router_from_config(config.router, list(inference.serving), clock)
    recorder = EpisodeRecorder(out_dir / "episodes") if config.metrics.record_episodes else None
    agents = _agent_plane(config, inference, router, clock)  # harness = agent: the gateway
    runner = _Keeping(EpisodeRunner(
        config.runner, tasks={t.task_id: t for t in tasks}, source=sandboxes.source,
        verifier=sandboxes.verifier, harness=make_harness_for(config),
        tokenizer=inference.tokenizer, clients=inference.clients, router=router, clock=clock,
        recorder=recorder, workload=workload or make_workload(config.workload),
        agent=agents.loop if agents is not None else None,
    ))
    summaries: list[BatchSummary] = []
    prom: Any = None
    async with contextlib.AsyncExitStack() as stack:
        log = stack.enter_context(EventLog(out_dir / "events.jsonl", now=clock.now))
        if agents is not None:
            log.record("gateway", clock.now(), url=await stack.enter_async_context(agents.serving()))
        if resume is not None:
            write_record(resume, log, clock.now())
        sinks: list[EventSink] = [log, *extra_sinks]
        if config.metrics.prometheus_port is not None:
            from rollbank.metrics.prometheus import PrometheusSink

            prom = PrometheusSink()
            port = prom.serve(config.metrics.prometheus_port)
            stack.callback(prom.close)
            sinks.append(prom)
            log.record("prometheus", clock.now(), port=port)
        if config.metrics.tensorboard:
            from rollbank.metrics.tensorboard import open_tensorboard

            tb = await asyncio.to_thread(open_tensorboard, out_dir / "tensorboard")
            stack.push_async_callback(asyncio.to_thread, tb.close)
            sinks.append(tb)
        if config.metrics.wandb:
            from rollbank.metrics.wandb import open_wandb

            wb = await asyncio.to_thread(open_wandb, out_dir / "wandb", name=out_dir.name,
                                         config=config.model_dump(mode="json"))
            stack.push_async_callback(asyncio.to_thread, wb.close)
            sinks.append(wb)
        progress = progress_sink(config.metrics.live, total_batches=sched.num_batches,
                                 groups_per_batch=sched.groups_per_batch)
        if progress is not None:
            stack.callback(progress.close)
            sinks.append(progress)
        task_ids = task_sequence(tasks, config.task_order_seed)
        verifiers = sched.verifier_slots or config.runner.verifier_slots or os.cpu_count()
        driver = collection_driver(sched.model_copy(update={"verifier_slots": verifiers}), runner,
                                   task_ids, sink=FanoutSink(*sinks), clock=clock, scorer=scorer,
                                   staleness=config.staleness,
                                   clients=list(inference.clients.values()),
                                   capacity=sandboxes.capacity, servers=inference.feed,
                                   on_servers=_joining(router))
        if resume is not None:
            driver.scheduler.resume_at(resume.next_index, resume.next_seq)
        log.record("run_started", clock.now(), tasks=len(tasks), servers=servers,
                   inference=inference.description, source=sandboxes.source.name,
                   capacity=capacity.to_dict() if capacity else None)
        t0: float | None = None
        consumed: set[str] = set()  # groups handed over: not in a later batch's bound pool
        # interrupted (Ctrl-C, SIGTERM, cancelled): summary.json and report.html still cover
        # what was done; the log and the progress view are still open when this runs
        stack.enter_context(_outputs_on_stop(lambda why: _finish_outputs(
            CollectResult(out_dir, summaries, list(runner.finished), capacity,
                          t0 if t0 is not None else clock.now(), clock.now(), setup_s,
                          _ledger(driver), _groups(driver)), config, progress, interrupted=why)))
        async with contextlib.aclosing(driver.batches(ahead=batches_ahead)) as batches:
            async for batch in batches:
                t0 = batch.window_start if t0 is None else t0
                s = summarize_batch(
                    batch.index, batch.trajectories, t_start=batch.window_start,
                    t_end=batch.ready_at, seen=list(runner.finished), capacity=capacity,
                    servers=servers, groups_needed=sched.groups_per_batch,
                    group_size=sched.bank.group_size,
                    sandbox_slots=driver.scheduler.sandbox_slots,
                    extra={"accounting": batch.accounting.to_dict(),
                           "profile": batch.profile.to_dict(), "complete": batch.complete,
                           "unreachable": [u.to_dict() for u in batch.unreachable],
                           **zero_variance_extra(batch.groups),
                           "groups": batch.meta.get("groups")},
                    staleness=batch.staleness.report if batch.staleness is not None else None,
                    consumed_groups=consumed,
                )
                consumed.update(t.group_id for t in batch.trajectories)
                if prom is not None:
                    prom.observe_staleness(batch.index, s.staleness)
                summaries.append(s)
                if not write_batches:
                    driver.ack(batch.index)
                    continue
                path = await asyncio.to_thread(write_batch, out_dir / "batches", batch,
                                               extra={"summary": s.to_dict()})
                # logged (written through) before any other await: after a SIGKILL the log
                # names every batch complete on disk (rollbank.metrics.events)
                log.record("batch_written", clock.now(), batch_index=batch.index, path=path,
                           time_to_batch_s=s.time_to_batch_s, efficiency=s.efficiency)
                if on_batch is not None:
                    await on_batch(batch, path)
                driver.ack(path)  # written: its groups are consumed (exactly-once hand-off)
                # the batch's buffers are freed now: hand the allocators' free pages back, or
                # RSS climbs to their high-water mark over a long run (rollbank.memory)
                await asyncio.to_thread(release_freed_memory)
                if isinstance(progress, PlainProgress):
                    progress.batch_written(batch.index, path, s.time_to_batch_s)
        t_end = clock.now() if not summaries else summaries[-1].t_end
        ledger = _ledger(driver)
        groups = _groups(driver)
        log.record("run_finished", clock.now(), batches=len(summaries), ledger=ledger)
    result = CollectResult(out_dir, summaries, list(runner.finished), capacity,
                           t0 if t0 is not None else t_end, t_end, setup_s, ledger, groups)
    await asyncio.to_thread(_finish_outputs, result, config, progress)
    return result


def _groups(driver: CollectionDriver) -> dict[str, Any]:
    hold = driver.scheduler.bank.hold
    return {"dynamic_sampling": hold.enabled, **hold.counts.to_dict()}


def _finish_outputs(result: CollectResult, config: CollectConfig, progress: object,
                    interrupted: str | None = None) -> None:
    """summary.json, report.html and the one-screen summary (``interrupted``: why the run
    stopped before its last batch)."""
    _write_summary(result, config, interrupted)
    if config.metrics.report:
        write_run_report(result, config, interrupted)
    if progress is not None:
        print("\n".join(run_summary_lines(
            [b.to_dict() for b in result.batches], out_dir=result.out_dir,
            setup_s=result.setup_s, collection_s=result.collection_s,
            attempts=len(result.trajectories), ledger=result.ledger, all_groups=result.groups,
            interrupted=interrupted)), file=sys.stderr, flush=True)


@contextlib.contextmanager
def _outputs_on_stop(write: Callable[[str], None]) -> Iterator[None]:
    """Run ``write("stopped by a signal or cancelled")`` when the body is cancelled or interrupted, then re-raise
    (a failure to write is reported, never hides the stop)."""
    try:
        yield
    except (asyncio.CancelledError, KeyboardInterrupt):
        try:
            write("stopped by a signal or cancelled")
        except Exception as exc:  # the stop goes on whatever happens here
            print(f"[rollbank] could not write the interrupted run's summary: {exc}",
                  file=sys.stderr, flush=True)
        raise


def _joining(router: Router) -> Callable[[tuple[str, ...]], None]:
    """The router learns every server that serves (known ones are ignored)."""
    def join(servers: tuple[str, ...]) -> None:
        for url in servers:
            router.on_server_ready(url)
    return join


def _nothing_left(resume: ResumePlan) -> CollectResult:
    """A resumed run whose batches were all written: record the resume, collect nothing."""
    with EventLog(resume.run_dir / "events.jsonl") as log:
        write_record(resume, log, time.monotonic())
    return CollectResult(resume.run_dir, [], [], None, 0.0, 0.0, 0.0)


def check_output_folder(out_dir: Path) -> None:
    """Fail fast, before any set-up, if ``out_dir`` cannot be created or written, or holds
    an earlier run's outputs (batches are written once). Creates it."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError("the output folder is a file", file=out_dir, field="output")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"the output folder cannot be created ({exc.strerror or exc})",
                         file=out_dir, field="output") from exc
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise InputError("the output folder is not writable", file=out_dir, field="output")
    batches = out_dir / "batches"
    earlier = [p.name for p in (out_dir / "events.jsonl", out_dir / "summary.json") if p.exists()]
    if batches.is_dir():
        earlier += [f"batches/{p.name}" for p in sorted(batches.iterdir())
                    if p.name.startswith("batch-")][:3]
    if earlier:
        raise InputError(
            f"the output folder already holds a run ({', '.join(earlier)}); choose another "
            f"output folder (--out), remove it, or continue it (--resume {out_dir})",
            file=out_dir, field="output")


def _ledger(driver: CollectionDriver) -> dict[str, Any]:
    """Final attempt accounting (launched = consumed + retried + waste once closed)."""
    ledger = driver.scheduler.bank.ledger
    counts = {state.value: n for state, n in ledger.counts().items()}
    waste = Counter(e.waste_reason.value for e in ledger.entries.values()
                    if e.waste_reason is not None)
    return {"launched": len(ledger.entries), **counts, "waste_by_reason": dict(sorted(waste.items())),
            "unreachable": [u.to_dict() for u in driver.scheduler.unreachable]}


def _write_summary(result: CollectResult, config: CollectConfig,
                   interrupted: str | None = None) -> Path:
    path = result.out_dir / "summary.json"
    data = {
        "interrupted": interrupted,
        "collection_s": result.collection_s,
        "setup_s": result.setup_s,
        "batches": [b.to_dict() for b in result.batches],
        "trajectories": len(result.trajectories),
        "capacity": result.capacity.to_dict() if result.capacity else None,
        "ledger": result.ledger,
        "zero_variance_share": zero_variance_share([b.to_dict() for b in result.batches]),
        "groups": result.groups,
        "wall_clock_finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    path.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    return path


@contextlib.asynccontextmanager
async def _timed(cm: contextlib.AbstractAsyncContextManager[Any], say: Callable[[str], None] | None,
                 what: str) -> AsyncIterator[Any]:
    t0 = time.monotonic()
    async with cm as value:
        if say is not None:
            say(f"{what} in {time.monotonic() - t0:.0f} s")
        yield value


def write_run_report(result: CollectResult, config: CollectConfig,
                     interrupted: str | None = None) -> Path:
    from rollbank.metrics.report import write_report

    events = read_events(result.out_dir / "events.jsonl")
    return write_report(
        result.out_dir / "report.html", title=f"rollbank collect: {result.out_dir.name}",
        trajectories=result.trajectories, events=events,
        batches=[b.to_dict() for b in result.batches],
        config=config.model_dump(mode="json"),
        setup_s=result.setup_s, ledger=result.ledger, interrupted=interrupted,
        notes=[f"collection {result.collection_s:.1f} s for {len(result.batches)} batch(es); "
               f"{len(result.trajectories)} attempts finished; set-up {result.setup_s:.1f} s"],
    )


async def enter_concurrently(stack: contextlib.AsyncExitStack,
                             *cms: contextlib.AbstractAsyncContextManager[Any]) -> list[Any]:
    """Enter ``cms`` at the same time (e.g. servers warming up while sandboxes are prepared);
    each one entered is pushed on ``stack``. If one fails, the others are cancelled (or exited
    if they already got in) and the first error is raised."""
    tasks = [asyncio.ensure_future(cm.__aenter__()) for cm in cms]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:  # also on our own cancellation: nothing half-entered is left behind
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for cm, t in zip(cms, tasks, strict=True):
            if not t.cancelled() and t.exception() is None:
                stack.push_async_exit(cm)
    for t in tasks:
        if t.cancelled():
            continue
        if (exc := t.exception()) is not None:
            raise exc
    return [t.result() for t in tasks]


async def run_collect(config: CollectConfig, *, out_dir: Path | None = None,
                      resume: ResumePlan | None = None) -> CollectResult:
    """Open the planes ``config`` describes, collect, release everything (``resume``:
    continue that crashed run, in its folder)."""
    from rollbank.episodes.sandboxes import open_sandboxes

    out = resume.run_dir if resume is not None else out_dir or Path(config.output)
    if resume is None:
        check_output_folder(out)  # before servers start
    elif resume.remaining == 0:  # every batch was written before the crash
        return _nothing_left(resume)
    tasks = select_tasks(config)
    say = plain_printer(config)
    t_setup = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        # Servers start (minutes of import and compile) while the warm pool is prepared.
        prepare = tasks_to_prepare(config, tasks)
        if say is not None:
            say(f"preparing sandboxes for {len(prepare)} of {len(tasks)} tasks while servers start "
                "(environments are built once, then cached)...")
        plane, sandboxes = await enter_concurrently(
            stack, open_inference(config.inference, max_model_len=config.runner.max_model_len, say=say,
                                  first_ready=True),
            _timed(open_sandboxes(config.sandbox, tasks, prepare=prepare), say, "sandboxes ready"))
        if say is not None:
            sched = config.scheduler.effective()
            say(f"set-up done in {time.monotonic() - t_setup:.0f} s; collecting {sched.num_batches} "
                f"batch(es) of {sched.groups_per_batch} groups x {sched.bank.group_size}")
        return await collect(config, tasks=tasks, inference=plane, sandboxes=sandboxes,
                             out_dir=out, setup_s=time.monotonic() - t_setup, resume=resume)


def _agent_plane(config: CollectConfig, inference: InferencePlane, router: Router,
                 clock: Clock) -> AgentPlane | None:
    """harness = agent: the gateway over this collection's router and clients, and the hook."""
    if config.harness != "agent":
        return None
    from rollbank.agents.plane import agent_plane

    inf = config.inference
    model = inf.managed.model if inf.kind == "managed" else inf.tokenizer if inf.kind == "external" \
        else None
    return agent_plane(config.agent, config.runner, clients=inference.clients, router=router,
                       tokenizer=inference.tokenizer, model=model, clock=clock,
                       gateway=config.gateway)
