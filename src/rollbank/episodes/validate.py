"""Validate tasks end to end: build, oracle must score 1, a no-op agent must not.

Owns: :func:`validate_task` / :func:`validate_tasks`, used by ``rollbank tasks validate``.
Each check runs in a FRESH sandbox started from the built layers: the oracle run uploads and
runs the solution then the verifier; the no-op run runs the verifier on the untouched
environment.

A task passes when the oracle's verifier status is ``pass`` (reward 1, every reward.json entry
1) and the no-op's status is ``fail`` (a reward was written and it is below 1). A verifier that
crashes, times out or writes nothing on the untouched environment fails validation: such a
task would turn model failures into infrastructure failures.

A task that validates leaves its verifier timings (no-op and oracle verifier seconds) in a
baseline file keyed by the task's content hash (``<cache>/validate/<hash>.json``);
counterfactual attribution (``episodes/counterfactual.py``) reads it, if present, to tell a
slow host from a model's loop.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollbank.config import cache_dir
from rollbank.episodes.validate_steps import StepsOutcome, run_oracle_steps
from rollbank.episodes.verifier import VerifierResult, VerifierStatus, run_oracle, run_verifier
from rollbank.errors import InputError, RollbankError
from rollbank.sandbox.protocol import Limits, SandboxBackend, SandboxSpec
from rollbank.tasks.builder import BuiltEnvironment, EnvironmentBuilder
from rollbank.tasks.model import Task


@dataclass
class Validation:
    """The outcome of validating one task (what ``--json`` prints)."""

    task_id: str
    path: str
    format: str
    content_hash: str
    ok: bool = False
    oracle_reward: float | None = None
    noop_reward: float | None = None
    oracle_status: str | None = None
    noop_status: str | None = None
    oracle_rewards: dict[str, float] = field(default_factory=dict)
    noop_rewards: dict[str, float] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    verify_timings: dict[str, float] = field(default_factory=dict)  # verifier alone, per run
    build_cached: bool | None = None
    approximations: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def spec_for(task: Task, built: BuiltEnvironment) -> SandboxSpec:
    """The sandbox spec of a task's built environment (no network: verifiers run offline)."""
    return SandboxSpec(
        layers=built.layers, workdir=built.workdir, env=dict(built.env),
        limits=Limits(cpus=task.cpus, memory_mb=task.memory_mb, storage_mb=task.storage_mb),
        network=False, label=task.task_id,
    )


@dataclass(frozen=True)
class VerifyBaseline:
    """How long the verifier took on this task when it validated (on this machine)."""

    content_hash: str
    noop_verify_s: float
    oracle_verify_s: float | None
    verifier_timeout_s: float


def baseline_path(content_hash: str, root: Path | None = None) -> Path:
    return (root or cache_dir() / "validate") / f"{content_hash}.json"


def save_baseline(b: VerifyBaseline, root: Path | None = None) -> Path:
    path = baseline_path(b.content_hash, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(b)) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def load_baseline(content_hash: str, root: Path | None = None) -> VerifyBaseline | None:
    """The recorded baseline, or None (never validated here, or an unreadable file)."""
    try:
        d = json.loads(baseline_path(content_hash, root).read_text(encoding="utf-8"))
        oracle = d.get("oracle_verify_s")
        return VerifyBaseline(str(d["content_hash"]), float(d["noop_verify_s"]),
                              None if oracle is None else float(oracle),
                              float(d["verifier_timeout_s"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _evidence(v: VerifierResult) -> dict[str, Any]:
    return {"exit_code": v.exit_code, "signal": v.signal, "error": v.error,
            "stdout_tail": v.stdout_tail[-1500:], "stderr_tail": v.stderr_tail[-1500:]}


def _record_steps(rec: Validation, task: Task, out: StepsOutcome) -> None:
    """Fill ``rec``'s oracle fields from a multi-step task's oracle run."""
    all_pass = len(out.results) == len(task.steps) and all(r.passed for _, r in out.results)
    rec.oracle_reward = out.trial_reward(task)
    rec.oracle_status = (VerifierStatus.PASS if all_pass else VerifierStatus.FAIL).value
    rec.oracle_rewards = out.rewards
    if out.solution_failures:
        rec.details["solution"] = out.solution_failures
    if out.stopped_after is not None:
        rec.details["stopped_after"] = out.stopped_after
    failed = {n: r.status.value for n, r in out.results if not r.passed}
    if failed:
        rec.details["oracle_steps"] = failed


async def validate_task(task: Task, backend: SandboxBackend, builder: EnvironmentBuilder, *,
                        baseline_dir: Path | None = None) -> Validation:
    """Validate one task; on success record its verifier baseline (under ``baseline_dir``,
    default ``<cache>/validate``)."""
    rec = Validation(task.task_id, str(task.path), task.format.value, task.content_hash,
                     warnings=list(task.warnings))
    t0 = time.monotonic()
    try:
        built = await asyncio.to_thread(builder.build, task)
    except InputError as exc:
        rec.error = f"build failed: {exc}"
        rec.timings["build_s"] = round(time.monotonic() - t0, 3)
        return rec
    rec.timings["build_s"] = round(time.monotonic() - t0, 3)
    rec.build_cached = built.cached
    rec.approximations = list(built.approximations)
    spec = spec_for(task, built)
    try:
        if task.steps:  # multi-step: every step's oracle then tests, in one sandbox
            t1 = time.monotonic()
            _record_steps(rec, task, await run_oracle_steps(task, backend, spec))
            rec.timings["oracle_s"] = round(time.monotonic() - t1, 3)
        elif task.solution is None:
            rec.error = "task has no oracle solution"
        else:
            t1 = time.monotonic()
            sb = await backend.start(spec)
            try:
                solve = await run_oracle(sb, task)
                oracle = await run_verifier(sb, task)
            finally:
                await sb.close()
            rec.timings["oracle_s"] = round(time.monotonic() - t1, 3)
            rec.oracle_reward, rec.oracle_status = oracle.reward, oracle.status.value
            rec.oracle_rewards = dict(oracle.rewards)
            rec.verify_timings["oracle_verify_s"] = round(oracle.duration_s, 3)
            if solve is not None and not solve.ok:
                rec.details["solution"] = {"exit_code": solve.exit_code, "timed_out": solve.timed_out,
                                           "stderr_tail": solve.stderr[-1500:]}
            if not oracle.passed:
                rec.details["oracle_verifier"] = _evidence(oracle)
        t2 = time.monotonic()
        sb = await backend.start(spec)
        try:
            noop = await run_verifier(sb, task.for_step(0) if task.steps else task)
        finally:
            await sb.close()
        rec.timings["noop_s"] = round(time.monotonic() - t2, 3)
        rec.noop_reward, rec.noop_status = noop.reward, noop.status.value
        rec.noop_rewards = dict(noop.rewards)
        rec.verify_timings["noop_verify_s"] = round(noop.duration_s, 3)
        if noop.status is not VerifierStatus.FAIL:
            rec.details["noop_verifier"] = _evidence(noop)
    except RollbankError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"
        return rec
    problems = []
    if rec.oracle_status is not None and rec.oracle_status != VerifierStatus.PASS.value:
        problems.append(f"oracle reward {rec.oracle_reward} ({rec.oracle_status}), expected 1")
    if rec.noop_status != VerifierStatus.FAIL.value:
        problems.append(f"no-op agent reward {rec.noop_reward} ({rec.noop_status}), expected below 1")
    if problems and rec.error is None:
        rec.error = "; ".join(problems)
    rec.ok = rec.error is None
    if rec.ok:
        try:
            await asyncio.to_thread(save_baseline, VerifyBaseline(
                task.content_hash, rec.verify_timings["noop_verify_s"],
                rec.verify_timings.get("oracle_verify_s"),
                task.verifier_timeout_s), baseline_dir)
        except OSError as exc:
            rec.warnings.append(f"could not record the verifier baseline: {exc}")
    return rec


async def validate_tasks(tasks: Sequence[Task], backend: SandboxBackend,
                         builder: EnvironmentBuilder, *, jobs: int = 1,
                         on_result: Callable[[Validation], None] | None = None,
                         baseline_dir: Path | None = None) -> list[Validation]:
    """Validate ``tasks``, at most ``jobs`` at a time; ``on_result`` sees each as it finishes.

    Returns the results in the order of ``tasks``.
    """
    sem = asyncio.Semaphore(max(1, jobs))
    results: dict[int, Validation] = {}

    async def one(i: int, task: Task) -> None:
        async with sem:
            rec = await validate_task(task, backend, builder, baseline_dir=baseline_dir)
        results[i] = rec
        if on_result is not None:
            on_result(rec)

    async with asyncio.TaskGroup() as tg:
        for i, t in enumerate(tasks):
            tg.create_task(one(i, t))
    return [results[i] for i in range(len(tasks))]
