"""Harbor's "installed agent" pattern: an agent program run INSIDE the attempt's sandbox,
reaching its gateway session through one forwarded endpoint (``agents/forward.py``).

``agent.entry = "rollbank.agents.in_sandbox:agent"`` with ``agent.options.command``: the
shell command that runs the agent in the sandbox (an agent installed in the task's image, or
one uploaded by ``agent.options.upload`` = a host path copied to ``/opt/agent``). It runs with
``OPENAI_BASE_URL``/``OPENAI_API_BASE`` (``http://127.0.0.1:PORT/s/<session>/v1``),
``OPENAI_API_KEY``, ``OPENAI_MODEL`` and ``ROLLBANK_INSTRUCTION`` (the task's instruction; also
in ``/tmp/rollbank-instruction.txt``) in the task's workdir; its wall time is charged to the
episode budget and capped by ``agent.timeout_s``. Exit 0: it returned; killed by a signal:
:class:`~rollbank.agents.contract.AgentProcessKilled`; another exit code: it raised.
Needs ``sandbox.local.agent_channels = true``.
"""

from __future__ import annotations

from pathlib import Path

from rollbank.agents.contract import LLM, AgentProcessKilled, AgentSandbox, AgentTask
from rollbank.agents.forward import forwarded
from rollbank.agents.sandbox_api import AttemptSandbox
from rollbank.errors import ConfigError


class AgentExitError(RuntimeError):
    """The in-sandbox agent exited non-zero."""


async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
    command = task.options.get("command")
    if not isinstance(command, str) or not command.strip():
        raise ConfigError("the in-sandbox agent needs agent.options.command", field="agent.options")
    if not isinstance(sandbox, AttemptSandbox):
        raise TypeError("the in-sandbox agent runs on rollbank's attempt sandbox")
    upload = task.options.get("upload")
    if isinstance(upload, str) and upload:
        await sandbox.upload(Path(upload), "/opt/agent")
    await sandbox.write_file("/tmp/rollbank-instruction.txt", task.instruction.encode())
    async with forwarded(sandbox.sandbox, llm) as fwd:
        env = {**fwd.llm.openai_env(), "OPENAI_MODEL": fwd.llm.model,
               "ROLLBANK_INSTRUCTION": task.instruction}
        r = await sandbox.exec_process(f"{fwd.start} && {command}", env=env)
    if r.signal is not None and not r.timed_out and not r.budget_exhausted:
        raise AgentProcessKilled(r.signal, "oom" if r.oom_killed else "")
    if r.exit_code not in (0, None):
        raise AgentExitError(f"exit {r.exit_code}: {(r.stderr or r.stdout)[-1000:]}")
