"""The attempt's sandbox as an agent drives it (:class:`AttemptSandbox`).

Invariants
- Every command is charged to the episode budget in billed seconds (wall minus measured host
  stall, as ``episodes/tools.py`` charges a harness's commands); its timeout is
  ``min(what the agent asked, runner.step_timeout_s, what is left of the budget)``; once the
  budget is spent nothing more runs (the result says ``budget_exhausted``).
- A command's own failure is data in its :class:`ExecResult`; a runtime failure raises
  :class:`~rollbank.errors.SandboxError` to the agent AND is recorded (``runtime_error``), so
  the verdict never depends on whether the agent reported it.
- Every command is recorded (:class:`CommandRecord`): the trajectory's steps and the replay
  that attribution may run on a pristine fork (``episodes/counterfactual.py``).
- File transfers are not charged (they are not the model's compute).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from rollbank.clock import Clock, MonotonicClock
from rollbank.errors import SandboxError, SandboxLostError
from rollbank.sandbox.protocol import DEFAULT_OUTPUT_LIMIT, ExecResult, Sandbox

T = TypeVar("T")


class AttemptOverError(RuntimeError):
    """The agent called its sandbox after its turn ended (timed out, cancelled)."""


@dataclass(frozen=True)
class CommandRecord:
    """One command the agent ran."""

    command: str
    started_at: float
    finished_at: float
    result: ExecResult | None  # None: the runtime failed (``error``)
    error: str | None = None


class AttemptSandbox:
    """Implements :class:`~rollbank.agents.contract.AgentSandbox` over a rollbank sandbox."""

    def __init__(self, sandbox: Sandbox, *, workdir: str, step_timeout_s: float,
                 budget_s: float | None, clock: Clock | None = None,
                 output_limit: int = DEFAULT_OUTPUT_LIMIT) -> None:
        self.sandbox = sandbox
        self._workdir = workdir or "/"
        self.step_timeout_s = step_timeout_s
        self.budget_s = budget_s
        self.output_limit = output_limit
        self.clock: Clock = clock or MonotonicClock()
        self.used_s = 0.0
        self.commands: list[CommandRecord] = []
        self.runtime_error: str | None = None
        self.node_lost = False
        self._sealed = False
        self._inflight: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------ AgentSandbox
    @property
    def workdir(self) -> str:
        return self._workdir

    @property
    def alive(self) -> bool:
        return self.sandbox.alive

    @property
    def remaining_s(self) -> float | None:
        return None if self.budget_s is None else max(self.budget_s - self.used_s, 0.0)

    @property
    def budget_exhausted(self) -> bool:
        return any(c.result is not None and c.result.budget_exhausted for c in self.commands)

    def stop(self) -> None:
        """Refuse every command from now on (the agent's time is up)."""
        self._sealed = True

    async def seal(self) -> None:
        """The agent's turn is over: cancel the commands still running (a thread-run agent
        outlives its cancelled coroutine) and refuse new ones, before the verifier runs."""
        self._sealed = True
        tasks = list(self._inflight)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def exec(self, command: str, *, timeout_s: float | None = None,
                   cwd: str | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        self._check_open()
        me = asyncio.current_task()
        if me is not None:
            self._inflight.add(me)
        try:
            return await self._exec(command, timeout_s=timeout_s, cwd=cwd, env=env)
        finally:
            if me is not None:
                self._inflight.discard(me)

    async def exec_process(self, command: str, *, cwd: str | None = None,
                           env: Mapping[str, str] | None = None) -> ExecResult:
        """A long-running agent process (an in-sandbox agent): like :meth:`exec`, but bounded
        by what is left of the episode budget only, not by the per-command timeout."""
        self._check_open()
        me = asyncio.current_task()
        if me is not None:
            self._inflight.add(me)
        try:
            return await self._exec(command, timeout_s=None, cwd=cwd, env=env, step_cap=False)
        finally:
            if me is not None:
                self._inflight.discard(me)

    def _check_open(self) -> None:
        if self._sealed:
            raise AttemptOverError("the attempt is over: its sandbox takes no more commands")

    async def _exec(self, command: str, *, timeout_s: float | None, cwd: str | None,
                    env: Mapping[str, str] | None, step_cap: bool = True) -> ExecResult:
        t0 = self.clock.now()
        left = self.remaining_s
        if left is not None and left <= 0:
            result = ExecResult(None, None, "", "", 0.0, budget_exhausted=True)
            self.commands.append(CommandRecord(command, t0, t0, result))
            return result
        timeout: float | None = self.step_timeout_s if timeout_s is None or timeout_s <= 0 \
            else min(timeout_s, self.step_timeout_s)
        if not step_cap:
            timeout = None
        by_budget = left is not None and (timeout is None or left <= timeout)
        if left is not None:
            timeout = left if timeout is None else min(timeout, left)
        try:
            result = await self.sandbox.exec(command, timeout_s=timeout, cwd=cwd or self._workdir,
                                             env=env, output_limit=self.output_limit)
        except SandboxError as exc:
            self.runtime_error = f"{type(exc).__name__}: {exc}"
            self.node_lost = self.node_lost or isinstance(exc, SandboxLostError)
            self.commands.append(CommandRecord(command, t0, self.clock.now(), None,
                                               self.runtime_error))
            raise
        self.used_s += result.billed_s
        if result.timed_out and by_budget:
            result = replace(result, timed_out=False, budget_exhausted=True)
        self.commands.append(CommandRecord(command, t0, self.clock.now(), result))
        return result

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        await self._io(self.sandbox.write_file(path, data, mode=mode))

    async def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        return await self._io(self.sandbox.read_file(path, limit=limit))

    async def upload(self, local: Path, remote: str) -> None:
        await self._io(self.sandbox.upload(local, remote))

    async def download(self, remote: str, local: Path) -> None:
        await self._io(self.sandbox.download(remote, local))

    async def _io(self, op: Coroutine[Any, Any, T]) -> T:
        if self._sealed:
            op.close()
        self._check_open()
        me = asyncio.current_task()
        if me is not None:
            self._inflight.add(me)
        try:
            return await op
        except SandboxError as exc:
            self.runtime_error = f"{type(exc).__name__}: {exc}"
            self.node_lost = self.node_lost or isinstance(exc, SandboxLostError)
            raise
        finally:
            if me is not None:
                self._inflight.discard(me)
