"""mini-swe-agent (PyPI ``mini-swe-agent``), unchanged, as an agent entry point (host-side).

``agent.entry = "rollbank.agents.mini_swe_agent:agent"``. mini-swe-agent is configured only
by its own settings: a YAML file in its format (``agent`` / ``model`` / ``environment``; by
default ``agents/configs/mini_swe_agent.yaml``, or ``agent.options.config``) to which rollbank
adds the attempt's values — ``model.model_name = "openai/<model>"`` and
``model.model_kwargs.api_base/api_key`` (LiteLLM's OpenAI-compatible provider pointed at the
attempt's gateway session), ``environment.attempt`` (its ``environment_class`` is
:class:`~rollbank.agents.minisweagent_env.RollbankEnvironment`: commands run in the attempt's
sandbox) and ``environment.cwd`` (the task's workdir). ``agent.options.step_limit`` overrides
``agent.step_limit``, ``agent.options.max_tokens`` its ``model.model_kwargs.max_tokens``.
Then mini-swe-agent's own ``get_model``, ``get_environment`` and
``DefaultAgent.run(task)`` run on a thread of their own (they are synchronous;
``contract.in_own_thread``).

Offline by its own settings: LiteLLM reads its bundled model-cost map
(``LITELLM_LOCAL_MODEL_COST_MAP``), mini-swe-agent starts silently and does not track cost.
"""

from __future__ import annotations

import asyncio
import copy
import os
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from rollbank.agents.contract import LLM, AgentSandbox, AgentTask, in_own_thread

_ENV_DEFAULTS = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "MSWEA_SILENT_STARTUP": "1",
                 "MSWEA_COST_TRACKING": "ignore_errors"}


def settings_for(task: AgentTask, llm: LLM) -> dict[str, Any]:
    """mini-swe-agent's settings for this attempt: its YAML plus the attempt's values."""
    src = task.options.get("config")
    text = Path(str(src)).read_text() if src else \
        resources.files("rollbank.agents.configs").joinpath("mini_swe_agent.yaml").read_text()
    cfg: dict[str, Any] = copy.deepcopy(yaml.safe_load(text) or {})
    model = cfg.setdefault("model", {})
    model["model_name"] = f"openai/{llm.model}"
    kwargs = model.setdefault("model_kwargs", {})
    kwargs.update(api_base=llm.base_url, api_key=llm.api_key)
    env = cfg.setdefault("environment", {})
    env.setdefault("environment_class", "rollbank.agents.minisweagent_env.RollbankEnvironment")
    env.update(attempt=task.attempt_id, cwd=task.workdir)
    if "max_tokens" in task.options:
        kwargs["max_tokens"] = int(task.options["max_tokens"])
    agent = cfg.setdefault("agent", {})
    if "step_limit" in task.options:
        agent["step_limit"] = int(task.options["step_limit"])
    return cfg


def _run(task: AgentTask, cfg: dict[str, Any]) -> dict[str, Any]:
    """mini-swe-agent's own API, on the agent's own thread."""
    from minisweagent.agents.default import DefaultAgent
    from minisweagent.environments import get_environment
    from minisweagent.models import get_model

    model = get_model(config=cfg.get("model", {}))
    env = get_environment(cfg.get("environment", {}))
    result: dict[str, Any] = DefaultAgent(model, env, **cfg.get("agent", {})).run(task.instruction)
    return result


async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
    """Run mini-swe-agent on ``task`` in ``sandbox`` with the model behind ``llm``."""
    for k, v in _ENV_DEFAULTS.items():
        os.environ.setdefault(k, v)
    from rollbank.agents import minisweagent_env

    cfg = settings_for(task, llm)
    minisweagent_env.register(task.attempt_id, sandbox, asyncio.get_running_loop())
    try:
        result = await in_own_thread(lambda: _run(task, cfg), name=f"mswea-{task.attempt_id}")
    finally:
        minisweagent_env.unregister(task.attempt_id)
    del result  # how it ended is judged by evidence (agents/verdict.py), not by its status
