"""Unmodified agent programs run as rollbank episodes (docs/agents.md).

- :mod:`rollbank.agents.config`: :class:`~rollbank.agents.config.AgentConfig` (``[agent]``).
- :mod:`rollbank.agents.contract`: the entry point ``async def agent(task, sandbox, llm)``:
  :class:`~rollbank.agents.contract.AgentTask`, :class:`~rollbank.agents.contract.LLM`,
  :class:`~rollbank.agents.contract.AgentSandbox`, ``load_entry("module:function")``,
  ``in_own_thread`` (a synchronous agent's blocking code, on a thread of its own).
- :mod:`rollbank.agents.sandbox_api`: the attempt's sandbox as the agent sees it (exec,
  upload, download; the episode budget charged, every command recorded for attribution).
- :mod:`rollbank.agents.session`: the gateway seam (one base URL + key per attempt).
- :mod:`rollbank.agents.tokens`: the gateway's session record -> the trajectory's tokens (pure).
- :mod:`rollbank.agents.verdict`: how an agent run ended -> a loop end and evidence (pure).
- :mod:`rollbank.agents.episode`: :class:`~rollbank.agents.episode.AgentLoop`, the runner's
  agent hook (open session, run the agent under the budget, close, record, probe).
- :mod:`rollbank.agents.mini_swe_agent`, :mod:`rollbank.agents.minisweagent_env`:
  mini-swe-agent, unchanged, host-side.
- :mod:`rollbank.agents.smolagents_agent`: smolagents' ``ToolCallingAgent``, unchanged.
- :mod:`rollbank.agents.forward`: the in-sandbox agent's one forwarded endpoint.

The package ``__init__`` imports nothing.
"""
