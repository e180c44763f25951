"""The agent entry point: ``async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None``.

An agent program is any async function of this shape, named ``module:function`` by
``agent.entry`` (docs/agents.md). The runner gives it:

- ``task``: the task's instruction, id, working directory and the operator's
  ``agent.options``;
- ``sandbox``: the attempt's rollbank sandbox — ``exec`` (a shell command, its result as
  data: exit code, output, timed out), ``write_file``/``read_file``, ``upload``/``download``,
  the way Terminus-2 drives its tmux session; every command is charged to the episode budget
  and recorded;
- ``llm``: the attempt's OpenAI-compatible endpoint — ``base_url`` (ends in ``/v1``),
  ``api_key`` (this attempt's key: valid for this attempt only, revoked when it ends) and
  ``model``.

Rules for an agent (the same as for a harness): talk to the model only through ``llm``;
return when done (the verifier then judges the sandbox). What it raises, how long it runs and
what it sends are recorded; the episode's outcome is decided by rollbank's attribution
(``agents/verdict.py``), never by the agent. The agent's model calls are the trajectory: tokens
exactly as the gateway recorded them.

A synchronous agent program (most are) runs in :func:`in_own_thread`, never in the event
loop's default executor (``asyncio.to_thread``): that executor has ``min(32, cpus + 4)``
workers and the loop's own I/O runs there (the local sandbox's shell writes each command to
its pipe through it), so agents that fill it while waiting on the loop stop every attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import importlib
import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypeVar, cast

from rollbank.errors import ConfigError
from rollbank.sandbox.protocol import ExecResult


@dataclass(frozen=True)
class AgentTask:
    """What the agent is asked to do."""

    task_id: str
    instruction: str
    workdir: str = "/"
    attempt_id: str = ""
    options: Mapping[str, str | int | float | bool] = field(default_factory=dict)


@dataclass(frozen=True)
class LLM:
    """The attempt's model endpoint (OpenAI-compatible)."""

    base_url: str  # ends in /v1
    api_key: str
    model: str

    def openai_env(self) -> dict[str, str]:
        """The environment the ``openai`` client and LiteLLM read."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_BASE": self.base_url,
                "OPENAI_API_KEY": self.api_key}


class AgentSandbox(Protocol):
    """The attempt's sandbox as an agent sees it (``agents/sandbox_api.py`` implements it)."""

    @property
    def workdir(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    async def exec(self, command: str, *, timeout_s: float | None = None,
                   cwd: str | None = None, env: Mapping[str, str] | None = None) -> ExecResult:
        """Run ``command`` with ``/bin/sh -c`` in the sandbox (cwd: the task's workdir)."""
        ...

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None: ...

    async def read_file(self, path: str, *, limit: int | None = None) -> bytes: ...

    async def upload(self, local: Path, remote: str) -> None: ...

    async def download(self, remote: str, local: Path) -> None: ...


class AgentProcessKilled(Exception):
    """Raised by an entry point whose agent process was ended by a signal."""

    def __init__(self, signal: int, detail: str = "") -> None:
        self.signal = signal
        super().__init__(f"agent process killed by signal {signal}{': ' + detail if detail else ''}")


AgentFn = Callable[[AgentTask, AgentSandbox, LLM], Awaitable[None]]

T = TypeVar("T")


async def in_own_thread(fn: Callable[[], T], *, name: str = "rollbank-agent") -> T:
    """``fn()`` on a thread of its own (daemon); its result or exception, awaited.

    One thread per call, so a run's agents never wait on each other for a worker, and never
    take the loop's default executor from the I/O that answers them. Cancelling the await
    does not stop the thread (no thread can be stopped): the agent's next sandbox command or
    model call fails once its attempt is over (the sandbox API is sealed, the key revoked)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()
    ctx = contextvars.copy_context()

    def settle(value: T | None, exc: BaseException | None) -> None:
        if done.done():  # cancelled meanwhile
            return
        if exc is not None:
            done.set_exception(exc)
        else:
            done.set_result(cast(T, value))

    def body() -> None:
        try:
            value, exc = ctx.run(fn), None
        except BaseException as e:  # handed to the awaiting task as is
            value, exc = None, e
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody awaits it any more
            loop.call_soon_threadsafe(settle, value, exc)

    threading.Thread(target=body, name=name, daemon=True).start()
    return await done


def load_entry(entry: str) -> AgentFn:
    """The async function ``entry`` (``module:function``) names; a bad one is a config error
    naming ``agent.entry`` (exit 3)."""
    mod_name, _, fn_name = entry.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {mod_name!r}: {exc}", field="agent.entry") from exc
    fn = getattr(module, fn_name, None)
    if fn is None or not inspect.iscoroutinefunction(fn):
        raise ConfigError(f"{entry!r} is not an async function (async def agent(task, sandbox, "
                          f"llm))", field="agent.entry")
    return cast(AgentFn, fn)
