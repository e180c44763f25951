"""A mini-swe-agent environment that runs its commands in the attempt's rollbank sandbox.

mini-swe-agent picks it by its own ``environment.environment_class`` setting
(``rollbank.agents.minisweagent_env.RollbankEnvironment``) and passes its own settings
(``cwd``, ``env``, ``timeout``) plus ``attempt``: the attempt id under which
:func:`register` put the attempt's sandbox. The agent runs in a worker thread; each command
is run on the runner's event loop (``run_coroutine_threadsafe``) through the
:class:`~rollbank.agents.contract.AgentSandbox`, so the episode budget, the per-command
timeout and the command record apply as for any agent. The output is what mini-swe-agent's
own ``LocalEnvironment`` returns (``output``, ``returncode``, ``exception_info``), and the
submission marker is its own check (``_check_finished``).

Host environment variables are never shown to the model (LocalEnvironment's template
variables would merge ``os.environ``; this one does not).
"""

from __future__ import annotations

import asyncio
import platform
import threading
from typing import Any

from minisweagent.environments.local import LocalEnvironment, LocalEnvironmentConfig
from minisweagent.utils.serialize import recursive_merge

from rollbank.agents.contract import AgentSandbox


class RollbankEnvironmentConfig(LocalEnvironmentConfig):
    attempt: str = ""
    """The attempt whose sandbox runs the commands (set by rollbank per attempt)."""


_LOCK = threading.Lock()
_ATTEMPTS: dict[str, tuple[AgentSandbox, asyncio.AbstractEventLoop]] = {}


def register(attempt: str, sandbox: AgentSandbox, loop: asyncio.AbstractEventLoop) -> None:
    with _LOCK:
        _ATTEMPTS[attempt] = (sandbox, loop)


def unregister(attempt: str) -> None:
    with _LOCK:
        _ATTEMPTS.pop(attempt, None)


class RollbankEnvironment(LocalEnvironment):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(config_class=RollbankEnvironmentConfig, **kwargs)

    def _target(self) -> tuple[AgentSandbox, asyncio.AbstractEventLoop]:
        with _LOCK:
            found = _ATTEMPTS.get(self.config.attempt)
        if found is None:
            raise RuntimeError(f"attempt {self.config.attempt!r} is over (or was never started)")
        return found

    def execute(self, action: dict[str, Any], cwd: str = "", *,
                timeout: int | None = None) -> dict[str, Any]:
        command = str(action.get("command", ""))
        sandbox, loop = self._target()
        limit = float(timeout or self.config.timeout)
        fut = asyncio.run_coroutine_threadsafe(
            sandbox.exec(command, timeout_s=limit, cwd=cwd or self.config.cwd or None,
                         env=dict(self.config.env)), loop)
        r = fut.result()
        out = r.stdout + r.stderr
        output: dict[str, Any] = {"output": out, "returncode": r.exit_code if r.exit_code is not None
                                  else -1, "exception_info": ""}
        if r.timed_out or r.budget_exhausted:
            why = "the episode's time budget is spent" if r.budget_exhausted else \
                f"the command timed out after {limit:g} seconds"
            output["exception_info"] = f"An error occurred while executing the command: {why}"
        self._check_finished(output)
        return output

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return recursive_merge(self.config.model_dump(), platform.uname()._asdict(), kwargs)
