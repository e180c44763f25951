"""smolagents (PyPI ``smolagents``), unchanged: its ``ToolCallingAgent`` with its
``OpenAIServerModel`` pointed at the attempt's gateway session, as an agent entry point.

``agent.entry = "rollbank.agents.smolagents_agent:agent"``. The agent has one tool, ``bash``
(a smolagents ``Tool``): a command run in the attempt's sandbox (its exit code and output tail
returned), plus smolagents' own ``final_answer``. The model's tool calls are parsed by the
gateway (``gateway.tool_parser``) and returned in OpenAI's ``tool_calls``; what smolagents
does with them is its own. It runs on a thread of its own (smolagents is synchronous); each tool
call runs on the runner's loop through the :class:`~rollbank.agents.contract.AgentSandbox`.

Why ToolCallingAgent and not CodeAgent: a CodeAgent executes the model's Python on the host
(smolagents' local interpreter is not an isolation boundary); a ToolCallingAgent only sends
the model's calls to the sandbox. ``agent.options``: ``max_steps`` (default 6), ``max_tokens``
(default 256), ``temperature`` (default 0.7), ``system_prompt`` (smolagents' own template).
"""

from __future__ import annotations

import asyncio
from importlib import resources
from typing import Any, ClassVar

import yaml

from rollbank.agents.contract import LLM, AgentSandbox, AgentTask, in_own_thread

OUTPUT_TAIL = 4000
#: smolagents' own ``system_prompt`` setting, short (its default is ~3000 tokens: more than a
#: small model's context); ``agent.options.system_prompt`` replaces it. Rendered by smolagents.
SYSTEM_PROMPT = """You solve tasks in a Linux shell by calling tools, one call per turn.
Tools:
{%- for tool in tools.values() %}
- {{ tool.name }}: {{ tool.description }}
{%- endfor %}
When the task is done, call final_answer."""


def build(task: AgentTask, sandbox: AgentSandbox, llm: LLM,
          loop: asyncio.AbstractEventLoop) -> Any:
    """The smolagents agent for this attempt (in the calling thread)."""
    from smolagents import OpenAIServerModel, Tool, ToolCallingAgent  # type: ignore[import-untyped]

    class BashTool(Tool):  # type: ignore[misc]
        name = "bash"
        description = ("Run one shell command in the task's Linux environment (a new shell in "
                       f"{task.workdir}); returns its exit code and output.")
        inputs: ClassVar[dict[str, dict[str, str]]] = {
            "command": {"type": "string", "description": "the shell command to run"}}
        output_type = "string"

        def forward(self, command: str) -> str:
            r = asyncio.run_coroutine_threadsafe(sandbox.exec(command), loop).result()
            note = " (timed out)" if r.timed_out else ""
            return f"exit code {r.exit_code}{note}\n{(r.stdout + r.stderr)[-OUTPUT_TAIL:]}"

    o = task.options
    model = OpenAIServerModel(model_id=llm.model, api_base=llm.base_url, api_key=llm.api_key,
                              max_tokens=int(o.get("max_tokens", 256)),
                              temperature=float(o.get("temperature", 0.7)))
    templates = yaml.safe_load(resources.files("smolagents.prompts").joinpath(
        "toolcalling_agent.yaml").read_text())
    templates["system_prompt"] = str(o.get("system_prompt", SYSTEM_PROMPT))
    return ToolCallingAgent(tools=[BashTool()], model=model, prompt_templates=templates,
                            max_steps=int(o.get("max_steps", 6)), verbosity_level=0)


async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
    """Run smolagents' ToolCallingAgent on ``task`` with the model behind ``llm``."""
    loop = asyncio.get_running_loop()

    def run() -> None:
        build(task, sandbox, llm, loop).run(task.instruction)

    await in_own_thread(run, name=f"smolagents-{task.attempt_id}")
