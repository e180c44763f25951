"""Running one action's commands in a sandbox, the same way for the runner and for replay.

:class:`ToolExecutor` owns the per-step timeout and the persistent shell session of one
episode. Replay uses the very same executor so that a recorded action produces its
observation by the same path.

Invariants
- A command's own failure (non-zero exit, timeout, OOM kill, truncated flood) is data in the
  :class:`ExecResult`; only a runtime failure raises (:class:`~rollbank.errors.SandboxError`).
- The per-step timeout is ``min(step_timeout_s, the Terminus-2 duration the model asked for,
  what is left of the episode budget)``, in billed seconds (wall time minus measured host
  stall, ``rollbank.sandbox.billing``). The executor, not the sandbox, charges the budget
  (sum of the commands' billed seconds), so the verifier that runs afterwards in the same sandbox is
  never charged to the model's budget. A command cut short by the budget comes back with
  ``budget_exhausted=True``; once the budget is spent nothing more runs.
- Commands stop at the first one that timed out or exhausted the budget.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace
from shlex import quote as _quote

from rollbank.episodes.harnesses import Command
from rollbank.sandbox.protocol import ExecResult, Sandbox, ShellSession


class ToolExecutor:
    def __init__(
        self,
        sandbox: Sandbox,
        *,
        step_timeout_s: float,
        use_shell: bool = True,
        workdir: str | None = None,
        budget_s: float | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.step_timeout_s = step_timeout_s
        self.use_shell = use_shell
        self.workdir = workdir
        self.budget_s = budget_s
        self.used_s = 0.0
        self._session: ShellSession | None = None

    @property
    def remaining_s(self) -> float | None:
        return None if self.budget_s is None else max(self.budget_s - self.used_s, 0.0)

    def timeout_for(self, command: Command) -> float:
        t = self.step_timeout_s
        if command.duration_s is not None and command.duration_s > 0:
            t = min(t, max(command.duration_s, 1.0))
        left = self.remaining_s
        return t if left is None else min(t, left)

    async def run_one(self, command: Command) -> ExecResult:
        left = self.remaining_s
        if left is not None and left <= 0:
            return ExecResult(None, None, "", "", 0.0, budget_exhausted=True)
        timeout = self.timeout_for(command)
        by_budget = left is not None and left < self.step_timeout_s and timeout >= left
        if self.use_shell:
            if self._session is None:
                self._session = await self.sandbox.shell()
                if self.workdir:
                    await self._session.run(f"cd {_quote(self.workdir)}", timeout_s=timeout)
            result = await self._session.run(command.text, timeout_s=timeout)
        else:
            result = await self.sandbox.exec(command.text, timeout_s=timeout, cwd=self.workdir)
        self.used_s += result.billed_s  # host stall is not the model's time
        if result.timed_out and by_budget:
            result = replace(result, timed_out=False, budget_exhausted=True)
        return result

    async def run(self, commands: Sequence[Command]) -> list[ExecResult]:
        results: list[ExecResult] = []
        for c in commands:
            r = await self.run_one(c)
            results.append(r)
            if r.timed_out or r.budget_exhausted:
                break
        return results

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


async def close_quietly(executor: ToolExecutor, sandbox: Sandbox) -> None:
    """Close the shell and the sandbox; a failing close must not hide the episode's outcome.
    The sandbox is closed even if the shell's close is cancelled (an aborted attempt: a frozen
    sandbox's shell takes seconds to go), else it would live until the backend closes."""
    try:
        with contextlib.suppress(Exception):  # the sandbox close below still kills everything
            await executor.close()
    finally:
        with contextlib.suppress(Exception):
            await sandbox.close()
