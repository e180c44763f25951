"""The runner's agent hook (:class:`AgentLoop`): an agent program in place of the harness loop.

Per attempt (the runner has acquired the sandbox and verifies and attributes afterwards):
open a gateway session for the attempt (its inference slot lent to the gateway) -> run the
entry point ``agent(task, sandbox, llm)`` under ``agent.timeout_s`` (the sandbox's commands
under the episode budget) -> seal the sandbox API (a command still in flight is cancelled,
none may start: the verifier sees a quiet sandbox) -> close the session (its key is revoked,
a request still running is cancelled) -> the session's tokens into the trajectory, exactly
(``agents/tokens.py``) -> on an error path the two experiments (sandbox probe, gateway health
probe) -> the loop end (``agents/verdict.py``).

Invariants
- ``run`` never raises for anything the agent did; only cancellation propagates, and then the
  session is closed and the sandbox API sealed as well.
- The session is closed on every path; the probe's own session too.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

from rollbank.agents.config import AgentConfig
from rollbank.agents.contract import LLM, AgentFn, AgentProcessKilled, AgentTask, load_entry
from rollbank.agents.sandbox_api import AttemptSandbox
from rollbank.agents.session import AgentGateway
from rollbank.agents.tokens import record_into, sandbox_facts, session_facts, steps_of
from rollbank.agents.verdict import (
    AgentEnd,
    AgentFacts,
    AgentRun,
    GatewayHealth,
    loop_end,
    needs_gateway_probe,
    needs_sandbox_probe,
)
from rollbank.clock import Clock, MonotonicClock
from rollbank.episodes.attempt import AttemptSpec
from rollbank.episodes.attribution import LoopEnd, Probe
from rollbank.episodes.harnesses import Command
from rollbank.episodes.trajectory import Trajectory
from rollbank.sandbox.protocol import Sandbox
from rollbank.tasks.model import Task

SandboxProbe = Callable[[Sandbox], Awaitable[Probe]]
GatewayProbe = Callable[[LLM, float], Awaitable[GatewayHealth]]


class AgentLoop:
    """Implements the runner's ``AgentHook`` (``episodes/runner.py``)."""

    name = "agent"

    def __init__(self, config: AgentConfig, gateway: AgentGateway, *, model: str,
                 step_timeout_s: float, max_model_len: int, min_new_tokens: int,
                 entry: AgentFn | None = None, gateway_probe: GatewayProbe | None = None,
                 clock: Clock | None = None) -> None:
        self.config = config
        self.gateway = gateway
        self.model = config.model or model
        self.step_timeout_s = step_timeout_s
        self.max_model_len = max_model_len
        self.min_new_tokens = min_new_tokens
        self.entry = entry or load_entry(config.entry)
        self.gateway_probe = gateway_probe or http_gateway_probe
        self.clock: Clock = clock or MonotonicClock()

    async def run(self, attempt: AttemptSpec, task: Task, traj: Trajectory, sandbox: Sandbox,
                  workdir: str | None, budget_s: float | None,
                  probe: SandboxProbe) -> tuple[LoopEnd, dict[str, Any]]:
        traj.meta["agent"] = {"entry": self.config.entry, "model": self.model}
        api = AttemptSandbox(sandbox, workdir=workdir or "/", step_timeout_s=self.step_timeout_s,
                             budget_s=budget_s, clock=self.clock)
        handle = self.gateway.open_session(attempt.attempt_id, attempt.group_id, model=self.model,
                                           slot=attempt.ctx.inference_slot)
        llm = LLM(handle.base_url, handle.api_key, handle.model)
        spec = AgentTask(task.task_id, task.instruction, workdir or "/", attempt.attempt_id,
                         dict(self.config.options))
        try:
            run = await self._run_agent(spec, api, llm)
        finally:
            await api.seal()
            record = await self.gateway.close_session(handle)
        record_into(traj, record)
        traj.steps = steps_of(record.requests, api.commands)
        traj.inference_s = sum(r.timings.total_s or 0.0 for r in record.requests)
        traj.tool_s = sum(c.finished_at - c.started_at for c in api.commands)
        traj.servers = list(dict.fromkeys(r.server for r in record.requests if r.server))
        ses = session_facts(record, max_model_len=self.max_model_len,
                            min_new_tokens=self.min_new_tokens)
        sb = sandbox_facts(api.commands, runtime_error=api.runtime_error, node_lost=api.node_lost)
        if needs_sandbox_probe(run, sb):
            p = await probe(sandbox)
            sb = replace(sb, answered=p.answered, probe_detail=f"{p.state.value}: {p.detail}")
        health = None
        if needs_gateway_probe(run, ses):
            health = await self._probe_gateway(attempt)
        return loop_end(AgentFacts(run, ses, sb, health))

    def replay_steps(self, traj: Trajectory) -> tuple[tuple[Command, ...], ...]:
        """The agent's commands, one per step (model-request steps run nothing)."""
        return tuple((Command(s.action),) if s.action else () for s in traj.steps)

    # ------------------------------------------------------------ internals
    async def _run_agent(self, spec: AgentTask, api: AttemptSandbox, llm: LLM) -> AgentRun:
        t0 = self.clock.now()
        task = asyncio.ensure_future(self.entry(spec, api, llm))
        try:
            done, _ = await asyncio.wait({task}, timeout=self.config.timeout_s)
        except asyncio.CancelledError:
            api.stop()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise
        if not done:  # time is up: no command may start from here on, not even its cleanup
            api.stop()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return AgentRun(AgentEnd.TIMED_OUT, self.clock.now() - t0,
                            f"agent.timeout_s ({self.config.timeout_s} s) passed")
        exc = task.exception()
        wall = self.clock.now() - t0
        if exc is None:
            return AgentRun(AgentEnd.RETURNED, wall)
        if isinstance(exc, AgentProcessKilled):
            return AgentRun(AgentEnd.KILLED, wall, str(exc))
        tb = "".join(traceback.format_exception(exc, limit=6))
        return AgentRun(AgentEnd.RAISED, wall, f"{type(exc).__name__}: {exc}\n{tb}")

    async def _probe_gateway(self, attempt: AttemptSpec) -> GatewayHealth:
        """One max_tokens=1 request through a fresh session of its own (no inference slot:
        the probe must not queue behind the attempts it judges)."""
        h = self.gateway.open_session(f"{attempt.attempt_id}/probe", attempt.group_id,
                                      model=self.model)
        try:
            return await self.gateway_probe(LLM(h.base_url, h.api_key, h.model),
                                            self.config.probe_timeout_s)
        finally:
            await self.gateway.close_session(h)


async def http_gateway_probe(llm: LLM, timeout_s: float) -> GatewayHealth:
    """POST /v1/completions (max_tokens 1) with the official wire shape; healthy = a 200 with
    a choice, within ``timeout_s``."""
    import httpx  # lazy: loading the agents part loads no HTTP client

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            r = await client.post(f"{llm.base_url}/completions", json={
                "model": llm.model, "prompt": "ok", "max_tokens": 1, "temperature": 0.0},
                headers={"Authorization": f"Bearer {llm.api_key}"})
        dt = loop.time() - t0
        if r.status_code == 200 and r.json().get("choices"):
            return GatewayHealth(True, dt)
        return GatewayHealth(False, dt, f"HTTP {r.status_code}: {r.text[:200]}")
    except (httpx.HTTPError, ValueError) as exc:
        return GatewayHealth(False, loop.time() - t0, f"{type(exc).__name__}: {exc}")
