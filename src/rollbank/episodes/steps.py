"""Multi-step (Harbor schema 1.1 ``[[steps]]``) episodes: steps in order, each one verified.

Owns: the runner's multi-step path (:class:`~rollbank.episodes.runner.EpisodeRunner` calls :func:`run_steps`
for a task with ``steps``). One sandbox and ONE conversation for all steps, as in a Harbor
trial. For step ``i`` (its single-step view ``task.for_step(i)``):

1. the step's setup hook (``workdir/`` merged into the working directory, ``setup.sh`` run
   there; :func:`~rollbank.episodes.validate_steps.setup_step`, as ``tasks validate`` does);
2. the model gets the step's instruction: the harness's first prompt for step 0, its
   ``step_prompt`` appended to the same conversation after that (turn indices continue);
3. the agent's turns (the runner's own loop, ``max_turns`` and the step's agent timeout per
   step; with ``runner.episode_budget_s`` set that budget covers the whole episode);
4. the step is verified and attributed by the runner's single-step path (``conclude``: the
   verifier slot, the counterfactual experiment on an error path), then ``/tests`` and
   ``/logs/verifier`` are removed again so the next step does not see this step's tests;
5. the trial stops after the step when its verdict is not trainable (infra / unknown: the
   episode's outcome is that verdict), when it has no reward, when the context is full, or
   when its reward misses ``min_reward`` (Harbor's early stop).

The trial reward follows ``multi_step_reward_strategy`` (``validate_steps.trial_reward``:
mean over the steps with ``contributes_to_mean``, steps never run count 0, or the final
step's). The outcome is ``model_success`` (verified_pass) only when the trial reward is 1;
otherwise the first step that did not pass names the reason (``verified_fail``, ``max_turns``
...). Per-step results go to ``Trajectory.task_steps``, the outcome's evidence
(``task_steps``, ``stopped_after``) and the episode file; the outcome's ``rewards`` are the
step rewards by step name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from rollbank.episodes.attempt import AttemptContext, AttemptSpec
from rollbank.episodes.attribution import VERIFIABLE, LoopEnd
from rollbank.episodes.config import RunnerConfig
from rollbank.episodes.conversation import Conversation
from rollbank.episodes.harnesses import Harness
from rollbank.episodes.outcome import EpisodeOutcome, Reason
from rollbank.episodes.tools import ToolExecutor
from rollbank.episodes.trajectory import StepRecord, TaskStepResult, Trajectory
from rollbank.episodes.validate_steps import setup_step, trial_reward
from rollbank.episodes.verifier import PASS_EPS
from rollbank.errors import SandboxError
from rollbank.inference.protocol import Tokenizer
from rollbank.sandbox.protocol import Sandbox
from rollbank.tasks.model import Task, passes_min_reward
from rollbank.tasks.shims import SHIM_DIR


class EpisodeOps(Protocol):
    """The episode operations a multi-step episode runs its steps with
    (:class:`~rollbank.episodes.runner.EpisodeRunner` implements them)."""

    @property
    def config(self) -> RunnerConfig: ...
    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def harness(self) -> Harness: ...

    async def loop(self, attempt: AttemptSpec, task: Task, traj: Trajectory,
                   executor: ToolExecutor, sandbox: Sandbox, conv: Conversation | None = None,
                   task_step: int | None = None) -> tuple[LoopEnd, dict[str, Any]]:
        """The agent's turns on ``conv`` (turn indices continue across steps)."""
        ...

    def observe(self, conv: Conversation, traj: Trajectory, text: str) -> bool:
        """Append ``text`` to the conversation; False (nothing appended) if no turn fits."""
        ...

    async def conclude(self, end: LoopEnd, evidence: dict[str, Any], task: Task,
                       traj: Trajectory, ctx: AttemptContext,
                       sandbox: Sandbox) -> EpisodeOutcome:
        """Verify and attribute (the counterfactual experiment on an error path)."""
        ...

#: Run between steps: what the previous step's verifier left must not guide the next step.
CLEAR_VERIFIER = f"rm -rf /tests /logs/verifier {SHIM_DIR}"


@dataclass(frozen=True)
class StepRun:
    """One step's agent part and verdict, as the caller (runner or replay) produced it."""

    end: LoopEnd
    outcome: EpisodeOutcome
    first_turn: int
    turns: int
    verify_s: float = 0.0


#: Runs step ``i`` (its view; the setup hook's error text, if it failed) and verifies it.
RunStep = Callable[[int, Task, str | None], Awaitable[StepRun]]


async def run_sequence(task: Task, sandbox: Sandbox, executor: ToolExecutor, workdir: str,
                       run_step: RunStep, *, episode_budget_s: float | None,
                       steps: int | None = None) -> tuple[EpisodeOutcome, list[TaskStepResult]]:
    """The steps in order (at most ``steps``): per-step budget, setup hook, ``run_step``, the
    early-stop rules, tests cleared between steps; the trial outcome and the step results."""
    results: list[TaskStepResult] = []
    last: EpisodeOutcome | None = None
    stop: str | None = None
    n = len(task.steps) if steps is None else min(steps, len(task.steps))
    for i in range(n):
        step, view = task.steps[i], task.for_step(i)
        if episode_budget_s is None:  # each step has its own agent timeout
            executor.budget_s = executor.used_s + view.agent_timeout_s
        setup_error: str | None = None
        if step.setup_dir is not None:
            try:
                await setup_step(sandbox, step.setup_dir, workdir)
            except SandboxError as exc:
                setup_error = f"step setup: {type(exc).__name__}: {exc}"
        run = await run_step(i, view, setup_error)
        out = last = run.outcome
        gate = out.reward is not None and passes_min_reward(step.min_reward, out.reward,
                                                            out.rewards)
        results.append(TaskStepResult(
            index=i, name=step.name, reward=out.reward, rewards=dict(out.rewards),
            outcome=out.outcome.value, reason=out.reason.value, loop_end=run.end.value,
            first_turn=run.first_turn, turns=run.turns, passed_min_reward=gate,
            verify_s=round(run.verify_s, 3)))
        if i == len(task.steps) - 1:
            break
        stop = _stop_reason(out, run.end, gate)
        if stop is not None:
            break
        with contextlib.suppress(SandboxError):  # a dead sandbox shows in the next step
            await sandbox.exec(CLEAR_VERIFIER, timeout_s=60)
    if last is None:
        raise ValueError(f"task {task.task_id}: no step to run")
    return trial_outcome(task, results, last, stop), results


async def run_steps(runner: EpisodeOps, attempt: AttemptSpec, task: Task, traj: Trajectory,
                    executor: ToolExecutor, sandbox: Sandbox,
                    workdir: str | None) -> EpisodeOutcome:
    """The runner's multi-step episode (see the module docstring): the trial's outcome."""
    conv = Conversation(runner.tokenizer, traj)

    async def run_step(i: int, view: Task, setup_error: str | None) -> StepRun:
        first = len(traj.steps)
        if setup_error is not None:
            end, evidence = LoopEnd.SANDBOX_DIED, {"turn": first, "error": setup_error}
        else:
            end, evidence = await _prompt_and_turns(runner, attempt, view, i, traj, executor,
                                                    sandbox, conv)
        if end in VERIFIABLE:
            await executor.close()  # as the runner does: the verifier may kill leftovers
        traj.verify_s = 0.0
        evidence = {**evidence, "task_step": i, "task_step_name": task.steps[i].name}
        out = await runner.conclude(end, evidence, view, traj, attempt.ctx, sandbox)
        return StepRun(end, out, first, len(traj.steps) - first, traj.verify_s)

    outcome, results = await run_sequence(
        task, sandbox, executor, workdir or task.workdir or "/", run_step,
        episode_budget_s=runner.config.episode_budget_s)
    traj.task_steps = results
    traj.verify_s = sum(r.verify_s for r in results)
    return outcome


async def _prompt_and_turns(runner: EpisodeOps, attempt: AttemptSpec, view: Task, i: int,
                            traj: Trajectory, executor: ToolExecutor, sandbox: Sandbox,
                            conv: Conversation) -> tuple[LoopEnd, dict[str, Any]]:
    """Step ``i``'s instruction into the conversation, then the agent's turns."""
    if i == 0:
        conv.start(runner.harness.initial_prompt(view))
    elif not runner.observe(conv, traj, runner.harness.step_prompt(view)):
        return LoopEnd.CONTEXT, {"turn": len(traj.steps), "prompt_tokens": len(conv)}
    return await runner.loop(attempt, view, traj, executor, sandbox, conv=conv, task_step=i)


def turn_in_step(turns: Sequence[StepRecord]) -> list[int]:
    """Each turn's index within its task step (a trace plan restarts at every step)."""
    firsts: dict[int | None, int] = {}
    return [t.index - firsts.setdefault(t.task_step, t.index) for t in turns]


def _stop_reason(out: EpisodeOutcome, end: LoopEnd, gate: bool) -> str | None:
    """Why the trial stops after this (not the last) step, or None to go on."""
    if not out.outcome.trainable:
        return "step_not_attributable_to_model"
    if out.reward is None:
        return "no_reward"
    if end is LoopEnd.CONTEXT:
        return "context_exhausted"
    if not gate:
        return "min_reward"
    return None


def trial_outcome(task: Task, results: list[TaskStepResult], last: EpisodeOutcome,
                  stop: str | None) -> EpisodeOutcome:
    """The trial's verdict from its steps' verdicts (pure; see the module docstring)."""
    ev: dict[str, Any] = {**last.evidence, "task_steps": [r.to_dict() for r in results],
                          "reward_strategy": task.multi_step_reward_strategy}
    if stop is not None:
        ev["stopped_after"] = results[-1].name
        ev["stop_reason"] = stop
    if not last.outcome.trainable:  # infra / unknown: the trial is not the model's doing
        return EpisodeOutcome(last.outcome, last.reason, None, dict(last.rewards), ev)
    rewards = {r.name: (r.reward if r.reward is not None else 0.0) for r in results}
    reward = trial_reward(task, rewards)
    ev["trial_reward"] = reward
    if reward >= 1.0 - PASS_EPS:
        return EpisodeOutcome.of(Reason.VERIFIED_PASS, reward=reward, rewards=rewards, **ev)
    failed = next((Reason(r.reason) for r in results if r.reason != Reason.VERIFIED_PASS.value),
                  None)
    if failed is None:  # every step run passed, yet steps are missing
        failed = Reason.CONTEXT_EXHAUSTED if stop == "context_exhausted" else Reason.VERIFIED_FAIL
    return EpisodeOutcome.of(failed, reward=reward, rewards=rewards, **ev)
