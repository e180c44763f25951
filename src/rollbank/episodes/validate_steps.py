"""Validate a multi-step (Harbor schema 1.1) task: every step's oracle, then its tests, in order.

Owns: the multi-step half of ``rollbank tasks validate`` (:mod:`rollbank.episodes.validate` calls
:func:`run_oracle_steps` for a task with ``steps`` and records its :class:`StepsOutcome`). One sandbox for all steps, as in a real trial:
for each step, its ``workdir/`` files are uploaded into the working directory (and its
``setup.sh`` run), its oracle solution runs, then its verifier (:meth:`Task.for_step`). The
oracle passes when every step passes; a step missing its ``min_reward`` stops the run (the
steps after it are not run, as in a trial). The no-op check runs the FIRST step's verifier on
the untouched environment; it must not score 1.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rollbank.episodes.verifier import VerifierResult, run_oracle, run_verifier
from rollbank.sandbox.protocol import Sandbox, SandboxBackend, SandboxSpec
from rollbank.tasks.model import Task, passes_min_reward


@dataclass
class StepsOutcome:
    """Per-step oracle results (in order; steps after an early stop are absent)."""

    results: list[tuple[str, VerifierResult]] = field(default_factory=list)
    solution_failures: dict[str, int | None] = field(default_factory=dict)
    stopped_after: str | None = None  # the step whose reward missed its min_reward

    @property
    def rewards(self) -> dict[str, float]:
        return {name: (r.reward if r.reward is not None else 0.0) for name, r in self.results}

    def trial_reward(self, task: Task) -> float:
        return trial_reward(task, self.rewards)


def trial_reward(task: Task, rewards: Mapping[str, float]) -> float:
    """The trial reward from step rewards by name: mean over contributing steps (unrun steps
    count 0) or the final step's (``multi_step_reward_strategy``). Shared with the runner."""
    if task.multi_step_reward_strategy == "final":
        return rewards.get(task.steps[-1].name, 0.0)
    counted = [s.name for s in task.steps if s.contributes_to_mean] or [s.name for s in task.steps]
    return sum(rewards.get(n, 0.0) for n in counted) / len(counted)


async def setup_step(sandbox: Sandbox, setup_dir: Path, workdir: str) -> None:
    """A step's setup hook: its ``workdir/`` merged into ``workdir``, its ``setup.sh`` run there."""
    await sandbox.upload(setup_dir, workdir)
    if (setup_dir / "setup.sh").is_file():
        await sandbox.exec(["/bin/bash", "-c", f"cd {shlex.quote(workdir)} && bash setup.sh"], timeout_s=600)


async def run_oracle_steps(task: Task, backend: SandboxBackend, spec: SandboxSpec) -> StepsOutcome:
    """Run every step's oracle then verifier, in order, in one fresh sandbox."""
    out = StepsOutcome()
    sb = await backend.start(spec)
    try:
        for i, step in enumerate(task.steps):
            view = task.for_step(i)
            if step.setup_dir is not None:
                await setup_step(sb, step.setup_dir, spec.workdir)
            solve = await run_oracle(sb, view)
            if solve is not None and not solve.ok:
                out.solution_failures[step.name] = solve.exit_code
            result = await run_verifier(sb, view)
            out.results.append((step.name, result))
            if not passes_min_reward(step.min_reward, result.reward, result.rewards):
                out.stopped_after = step.name
                break
    finally:
        await sb.close()
    return out
