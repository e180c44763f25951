"""Episode files, and replaying one in a fresh sandbox.

An episode file (JSON, schema ``rollbank.episode/1``) records what reproduces an episode: the
task id, folder and content hash, the environment's layer hashes, the seed, the harness and
runner limits, every model turn's text with the exact action parsed from it and the
observation fed back, the tokens, timings and the outcome.

:func:`replay_episode` re-runs the recorded actions, in order, in a fresh sandbox from the
same kind of source, through the same :class:`~rollbank.episodes.tools.ToolExecutor` and
harness, then runs the verifier; it reports, step by step, whether each observation matches
and whether the reward matches. It never calls a model: the model's text is replayed as
recorded. It then decides the replayed episode's outcome again, with the same counterfactual
experiment as the runner (``episodes/counterfactual.py``: probes, a pristine re-verify), and
reports it beside the recorded one: reproducing an episode includes reproducing its verdict.
A multi-step episode is replayed step by step (``episodes/steps.run_sequence``, as the runner
ran it: setup hook, that step's turns, that step's verdict, the early-stop rules).

Episode files are typed (``episodes/episode_file.py``): a malformed one is an
:class:`~rollbank.errors.InputError` naming the file and the field.

Invariants
- Writing an episode file never raises into the runner (an I/O error is reported on stderr
  and the collection goes on); files are written atomically (temp file + rename).
- A replay closes its sandbox on every path.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rollbank.episodes.attribution import (
    TIMED_OUT_ENDS,
    VERIFIABLE,
    Experiment,
    LoopEnd,
    VerifierVerdict,
    attribute,
    needs_disk_check,
    needs_experiment,
    stalled,
)
from rollbank.episodes.counterfactual import Counterfactual, ReplaySpec
from rollbank.episodes.episode_file import SCHEMA, EpisodeFile, StepEntry, read_episode
from rollbank.episodes.harnesses import ActionKind, Harness
from rollbank.episodes.outcome import EpisodeOutcome
from rollbank.episodes.sources import SandboxSource, Verifier
from rollbank.episodes.steps import StepRun, run_sequence
from rollbank.episodes.tools import ToolExecutor, close_quietly
from rollbank.episodes.trajectory import Trajectory
from rollbank.errors import InputError, SandboxError
from rollbank.sandbox.protocol import Sandbox
from rollbank.tasks.model import Task

__all__ = ["SCHEMA", "EpisodeFile", "EpisodeRecorder", "ReplayReport", "load_episode",
           "replay_episode", "write_episode"]


def episode_filename(trajectory_id: str) -> str:
    return trajectory_id.replace("/", "__") + ".json"


def episode_record(traj: Trajectory, task: Task, meta: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "trajectory_id": traj.trajectory_id,
        "group_id": traj.group_id,
        "task_id": traj.task_id,
        "task_path": str(task.path),
        "task_hash": traj.task_hash,
        "layer_hashes": list(traj.layer_hashes),
        "seed": traj.seed,
        "attempt": traj.attempt,
        "retry": traj.retry,
        "servers": list(traj.servers),
        "harness": meta.get("harness"),
        "source": meta.get("source"),
        "sandbox_kind": meta.get("sandbox_kind"),
        "workdir": meta.get("workdir"),
        "runner": meta.get("runner", {}),
        "steps": [s.to_dict() for s in traj.steps],
        "task_steps": [s.to_dict() for s in traj.task_steps],
        "outcome": traj.outcome.to_dict() if traj.outcome else None,
        "timings": {
            "launched_at": traj.launched_at, "started_at": traj.started_at,
            "finished_at": traj.finished_at, "sandbox_setup_s": traj.sandbox_setup_s,
            "inference_s": traj.inference_s, "tool_s": traj.tool_s, "verify_s": traj.verify_s,
        },
        "tokens": {
            "prompt_len": traj.prompt_len, "token_ids": traj.token_ids,
            "loss_mask": traj.loss_mask, "logprobs": traj.logprobs,
            "policy_versions": traj.policy_versions,
        },
        "spans": traj.meta.get("spans", []),
    }


def write_episode(path: Path, record: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def load_episode(path: Path) -> EpisodeFile:
    """Read and validate an episode file (typed; errors name the file and field)."""
    return read_episode(path)


class EpisodeRecorder:
    """Writes every finished episode to ``<root>/<trajectory id>.json`` (an ``EpisodeSink``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.written = 0
        self.failed = 0

    async def record(self, traj: Trajectory, task: Task, meta: Mapping[str, Any]) -> None:
        rec = episode_record(traj, task, meta)
        try:
            await asyncio.to_thread(write_episode, self.root / episode_filename(traj.trajectory_id), rec)
            self.written += 1
        except OSError as exc:
            self.failed += 1
            print(f"rollbank: could not write episode {traj.trajectory_id}: {exc}", file=sys.stderr)


@dataclass
class StepReplay:
    index: int
    action: str | None
    matched: bool
    recorded: str
    replayed: str


@dataclass
class ReplayReport:
    episode: str
    task_id: str
    task_hash_match: bool
    layer_hashes_match: bool | None
    steps: list[StepReplay] = field(default_factory=list)
    reward_recorded: float | None = None
    reward_replayed: float | None = None
    verifier_error: str | None = None
    outcome_recorded: dict[str, Any] | None = None
    outcome_replayed: dict[str, Any] | None = None
    error: str | None = None

    @property
    def observations_match(self) -> bool:
        return all(s.matched for s in self.steps)

    @property
    def reward_match(self) -> bool:
        return self.reward_recorded == self.reward_replayed

    @property
    def outcome_match(self) -> bool:
        """Same outcome and reason as recorded (the verdict reproduced)."""
        a, b = self.outcome_recorded or {}, self.outcome_replayed or {}
        return (a.get("outcome"), a.get("reason")) == (b.get("outcome"), b.get("reason"))

    @property
    def ok(self) -> bool:
        return (self.error is None and self.task_hash_match and self.observations_match
                and self.reward_match and self.outcome_match)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(observations_match=self.observations_match, reward_match=self.reward_match,
                 outcome_match=self.outcome_match, ok=self.ok, steps_total=len(self.steps),
                 steps_matched=sum(s.matched for s in self.steps))
        first = next((s for s in self.steps if not s.matched), None)
        d["first_mismatch"] = asdict(first) if first else None
        d["steps"] = [{"index": s.index, "matched": s.matched} for s in self.steps]
        return d


async def replay_episode(
    record: EpisodeFile,
    *,
    task: Task,
    source: SandboxSource,
    verifier: Verifier,
    harness: Harness,
    counterfactual: Counterfactual | None = None,
) -> ReplayReport:
    """Re-run the recorded actions in a fresh sandbox; compare observations, reward, verdict."""
    outcome = record.outcome
    runner = record.runner
    report = ReplayReport(
        episode=record.trajectory_id, task_id=task.task_id,
        task_hash_match=task.content_hash == record.task_hash, layer_hashes_match=None,
        reward_recorded=outcome.reward if outcome else None,
        outcome_recorded=_brief(outcome.to_outcome()) if outcome else None,
    )
    judge = counterfactual or Counterfactual(source, verifier,
                                             probe_timeout_s=runner.health_probe_timeout_s,
                                             replay_cap_s=runner.replay_cap_s)
    try:
        acq = await source.acquire(task, budget_s=None)
    except (SandboxError, InputError) as exc:
        report.error = f"sandbox: {type(exc).__name__}: {exc}"
        return report
    report.layer_hashes_match = list(acq.layer_hashes) == list(record.layer_hashes)
    executor = ToolExecutor(acq.sandbox, step_timeout_s=runner.step_timeout_s,
                            use_shell=runner.use_shell, workdir=record.workdir or acq.workdir,
                            budget_s=runner.episode_budget_s or task.agent_timeout_s)
    try:  # the sandbox is closed even if the shell's close fails or is cancelled
        if task.multi_step and record.task_steps:  # each step replayed and verified in turn
            decided = await _replay_steps(report, judge, record, task, acq.sandbox, executor,
                                          harness, verifier, record.workdir or acq.workdir)
            report.outcome_replayed = _brief(decided)
            report.reward_replayed = decided.reward
            return report
        await _replay_single(report, judge, record, task, acq.sandbox, executor, harness,
                             verifier)
    finally:
        await close_quietly(executor, acq.sandbox)
    return report


async def _replay_single(report: ReplayReport, judge: Counterfactual, record: EpisodeFile,
                         task: Task, sandbox: Sandbox, executor: ToolExecutor, harness: Harness,
                         verifier: Verifier) -> None:
    """A single-step episode: the recorded turns replayed, then the ending decided again."""
    runner, outcome = record.runner, record.outcome
    recorded_end = outcome.loop_end if outcome else None
    end = LoopEnd(recorded_end) if recorded_end in set(LoopEnd) else None
    evidence: dict[str, Any] = {"replay": True}
    try:
        for step in record.steps:
            report.steps.append(await _replay_step(step, harness, executor))
        if not sandbox.alive and end is not None and end in VERIFIABLE:
            end = LoopEnd.SANDBOX_DIED
        if end is not None and end in VERIFIABLE:
            await executor.close()
    except SandboxError as exc:
        report.error = f"sandbox died during replay: {exc}"
        end, evidence = LoopEnd.SANDBOX_DIED, {"replay": True, "error": str(exc)}
    if end is None:
        return
    spec = ReplaySpec(tuple(harness.parse(s.model_text).commands for s in record.steps),
                      step_timeout_s=runner.step_timeout_s, use_shell=runner.use_shell,
                      workdir=record.workdir,
                      budget_s=runner.episode_budget_s or task.agent_timeout_s)
    decided = await _decide(judge, end, evidence, record, task, sandbox, verifier, spec)
    report.outcome_replayed = _brief(decided)
    if end in VERIFIABLE:
        report.reward_replayed = decided.reward
        err = decided.evidence.get("verifier_error")
        report.verifier_error = err if isinstance(err, str) else None


async def _replay_steps(report: ReplayReport, judge: Counterfactual, record: EpisodeFile,
                        task: Task, sandbox: Sandbox, executor: ToolExecutor, harness: Harness,
                        verifier: Verifier, workdir: str | None) -> EpisodeOutcome:
    """A multi-step episode: the recorded steps in order (``episodes/steps.run_sequence``),
    each step's turns replayed then decided like the runner decided them."""
    limits = record.runner

    async def run_step(i: int, view: Task, setup_error: str | None) -> StepRun:
        turns = [s for s in record.steps if s.task_step == i]
        first, recorded = len(report.steps), record.task_steps[i].loop_end
        end = LoopEnd(recorded) if recorded in set(LoopEnd) else LoopEnd.DONE
        evidence: dict[str, Any] = {"replay": True, "task_step": i,
                                    "task_step_name": task.steps[i].name}
        if setup_error is not None:
            end, evidence = LoopEnd.SANDBOX_DIED, {**evidence, "error": setup_error}
        else:
            try:
                for step in turns:
                    report.steps.append(await _replay_step(step, harness, executor))
                if not sandbox.alive and end in VERIFIABLE:
                    end = LoopEnd.SANDBOX_DIED
                if end in VERIFIABLE:
                    await executor.close()
            except SandboxError as exc:
                report.error = f"sandbox died during replay: {exc}"
                end, evidence = LoopEnd.SANDBOX_DIED, {**evidence, "error": str(exc)}
        so_far = [s for s in record.steps if s.task_step is not None and s.task_step <= i]
        spec = ReplaySpec(tuple(harness.parse(s.model_text).commands for s in so_far),
                          step_timeout_s=limits.step_timeout_s, use_shell=limits.use_shell,
                          workdir=workdir, budget_s=limits.episode_budget_s or view.agent_timeout_s)
        out = await _decide(judge, end, evidence, record, view, sandbox, verifier, spec)
        return StepRun(end, out, first, len(turns))

    decided, _ = await run_sequence(task, sandbox, executor, workdir or task.workdir or "/",
                                    run_step, episode_budget_s=limits.episode_budget_s,
                                    steps=len(record.task_steps))
    return decided


async def _decide(judge: Counterfactual, end: LoopEnd, evidence: dict[str, Any],
                  record: EpisodeFile, task: Task, sandbox: Sandbox,
                  verifier: Verifier, spec: ReplaySpec) -> EpisodeOutcome:
    """The runner's verification and attribution path, on the replayed sandbox."""
    verdict: VerifierVerdict | None = None
    exp: Experiment | None = None
    if end in TIMED_OUT_ENDS:
        exp = await judge.after_step_timeout(sandbox, task, spec)
    if end in VERIFIABLE and not stalled(exp):
        try:
            verdict = await verifier.verify(sandbox, task)
        except SandboxError as exc:
            end, evidence = LoopEnd.SANDBOX_DIED, {**evidence, "verifier_error": str(exc)}
    if needs_experiment(end, verdict):
        spec = replace(spec, then_verify=verdict is not None)
        exp = await judge.after_error(end, verdict, sandbox, task, spec)
    elif needs_disk_check(end, verdict) and not evidence.get("node_lost"):
        # a verified failure: a full writable layer is the host's or the model's?
        disk = await judge.after_fail(sandbox, task, spec)
        if disk is not None:
            exp = replace(disk, episode=exp.episode) if exp is not None else disk
    try:
        usage = sandbox.usage()
    except Exception:  # a dead runtime may not report usage
        usage = None
    return attribute(end, verdict=verdict, usage=usage, actions=[s.action for s in record.steps],
                     evidence=evidence, experiment=exp)


def _brief(o: EpisodeOutcome) -> dict[str, Any]:
    d: dict[str, Any] = {"outcome": o.outcome.value, "reason": o.reason.value, "reward": o.reward}
    for key in ("attribution", "experiment", "verifier_error", "hint_destructive"):
        if key in o.evidence:
            d[key] = o.evidence[key]
    return d


async def _replay_step(step: StepEntry, harness: Harness, executor: ToolExecutor) -> StepReplay:
    action = harness.parse(step.model_text)
    recorded = step.observation
    if action.kind is ActionKind.MALFORMED:
        got = action.observation or ""
    elif action.commands:
        got = harness.format_observation(await executor.run(action.commands))
    else:
        got = ""
    return StepReplay(step.index, action.command_text,
                      got == recorded and action.command_text == step.action, recorded, got)

