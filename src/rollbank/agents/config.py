"""Configuration of agent episodes (``harness = "agent"``): which program, its limits.

Loading it imports no agent program, HTTP client or engine (``load_entry`` does, at run time).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from rollbank.config import Section

#: mini-swe-agent, unchanged, on the host (docs/agents.md).
DEFAULT_ENTRY = "rollbank.agents.mini_swe_agent:agent"


class AgentConfig(Section):
    """An agent program run as an episode: ``async def agent(task, sandbox, llm) -> None``."""

    entry: str = Field(
        default=DEFAULT_ENTRY,
        description="the agent's entry point as 'module:function' (an async function taking "
        "task, sandbox, llm; docs/agents.md); built in: rollbank.agents.mini_swe_agent:agent, "
        "rollbank.agents.smolagents_agent:agent, rollbank.agents.in_sandbox:agent",
    )
    model: str | None = Field(
        default=None, description="the model name the agent sends (llm.model); None: the "
        "served model's name (inference.managed.model)",
    )
    timeout_s: float = Field(
        default=600.0, gt=0, description="wall seconds the agent may run; past it the agent is "
        "cancelled and the episode ends as the model's timeout (budget_exhausted) unless the "
        "gateway probe finds the engines unhealthy (inference_error)",
    )
    probe_timeout_s: float = Field(
        default=30.0, gt=0, description="deadline of the gateway health probe (one "
        "max_tokens=1 request through a fresh session) run on an agent's error paths",
    )
    options: dict[str, str | int | float | bool] = Field(
        default_factory=dict, description="settings handed to the entry point as task.options "
        "(e.g. mini-swe-agent: config = a YAML file of its own settings, step_limit; "
        "smolagents: max_steps; in-sandbox: command)",
    )

    @field_validator("entry")
    @classmethod
    def _module_colon_function(cls, v: str) -> str:
        mod, sep, fn = v.partition(":")
        if not sep or not mod or not fn or not all(p.isidentifier() for p in mod.split(".")) \
                or not fn.isidentifier():
            raise ValueError(f"entry must be 'module:function' (e.g. {DEFAULT_ENTRY}), not {v!r}")
        return v
