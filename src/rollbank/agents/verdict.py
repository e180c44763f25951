"""How an agent run ended -> the runner's :class:`~rollbank.episodes.attribution.LoopEnd` and
evidence. Pure: every fact is gathered by ``agents/episode.py`` (the agent's end, the
gateway's session record, the sandbox's record, and on error paths two experiments: a probe
of the sandbox and a health probe of the gateway — one ``max_tokens=1`` request through a
fresh session). The runner then verifies and attributes by the usual path
(``episodes/attribution.py``: a dead sandbox is decided by a pristine fork and the replay of
the agent's commands).

Rules, in order (docs/agents.md, "Who is to blame")
1. The sandbox's runtime failed during the run, or it no longer answers -> ``sandbox_died``
   (the experiment decides: pristine fork, then the replay of the agent's commands).
2. A command the host stalled beyond the cap -> ``host_error`` (``host_stalled``).
3. The agent did not return (raised, killed, timed out) and the gateway probe fails ->
   ``inference_error`` (the engines, not the agent, stopped it).
4. It did not return and the gateway recorded an engine-side failure of one of its requests
   (error, abort) -> ``inference_error``; a refusal whose prompt no longer fits the context
   (measured: prompt ids + min_new_tokens > max_model_len) -> ``context`` (the model's), or
   ``prompt_too_long`` (infra) when no request had been answered yet (the agent's own first
   prompt does not fit: the model never acted), whether the agent returned or not.
5. No request of the agent was answered by the engine (it never called the model, or every
   request it sent was malformed) -> ``agent_no_model_call`` (infra: nothing the model did,
   whether it returned, raised or timed out).
6. It timed out (``agent.timeout_s``) -> ``budget`` (the model's timeout, verified: a solved
   task still passes); the episode's command budget spent -> ``budget`` as well.
7. It raised or was killed while the gateway and the sandbox are healthy ->
   ``agent_error`` (infra: an agent program must not crash on the model's output, as a
   harness must not; the error and the last requests are the evidence).
8. It returned -> ``done`` (verified).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rollbank.episodes.attribution import LoopEnd


class AgentEnd(StrEnum):
    RETURNED = "returned"
    RAISED = "raised"
    TIMED_OUT = "timed_out"  # agent.timeout_s (wall) passed: cancelled by the runner
    KILLED = "killed"  # its process ended by a signal (a process or in-sandbox agent)


@dataclass(frozen=True)
class AgentRun:
    end: AgentEnd
    wall_s: float
    error: str | None = None


@dataclass(frozen=True)
class SessionFacts:
    """What the gateway recorded for the attempt's session (``tokens.session_facts``)."""

    requests: int = 0  # requests that reached generation
    ok: int = 0  # answered with model tokens
    rejected: int = 0  # refused before generation (malformed body, wrong mode)
    engine_errors: tuple[str, ...] = ()  # requests the engine failed or aborted
    context_refusals: tuple[int, ...] = ()  # prompt lengths of refusals that did not fit
    cancelled: int = 0  # the agent's connection went away mid-request


@dataclass(frozen=True)
class SandboxFacts:
    runtime_error: str | None = None
    node_lost: bool = False
    answered: bool | None = None  # the sandbox probe after an error path (None: not probed)
    probe_detail: str = ""
    budget_exhausted: bool = False
    host_stalled: bool = False
    commands: int = 0


@dataclass(frozen=True)
class GatewayHealth:
    healthy: bool
    duration_s: float = 0.0
    detail: str = ""


@dataclass(frozen=True)
class AgentFacts:
    run: AgentRun
    session: SessionFacts
    sandbox: SandboxFacts
    gateway: GatewayHealth | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def needs_sandbox_probe(run: AgentRun, sandbox: SandboxFacts) -> bool:
    """Probe the sandbox whenever the agent did not return (a crash may be the sandbox's)."""
    return run.end is not AgentEnd.RETURNED and sandbox.runtime_error is None


def needs_gateway_probe(run: AgentRun, session: SessionFacts) -> bool:
    """The gateway is probed whenever the agent did not return, or its session recorded an
    engine-side failure."""
    return run.end is not AgentEnd.RETURNED or bool(session.engine_errors)


def loop_end(facts: AgentFacts) -> tuple[LoopEnd, dict[str, Any]]:
    """The rules of the module docstring, in order."""
    run, ses, sb, gw = facts.run, facts.session, facts.sandbox, facts.gateway
    ev: dict[str, Any] = {"agent_end": run.end.value, "agent_wall_s": round(run.wall_s, 3),
                          "model_requests": ses.requests, "model_requests_ok": ses.ok,
                          "rejected_requests": ses.rejected, "agent_commands": sb.commands,
                          **facts.extra}
    if run.error:
        ev["agent_error"] = run.error[-2000:]
    if ses.engine_errors:
        ev["engine_errors"] = list(ses.engine_errors[-3:])
    if gw is not None:
        ev["gateway_probe"] = {"healthy": gw.healthy, "duration_s": round(gw.duration_s, 3),
                               "detail": gw.detail[-300:]}
    if sb.answered is not None:
        ev["sandbox_probe"] = {"answered": sb.answered, "detail": sb.probe_detail[-300:]}
    returned = run.end is AgentEnd.RETURNED
    if sb.runtime_error is not None or sb.answered is False:
        if sb.runtime_error:
            ev["error"] = sb.runtime_error
        if sb.node_lost:
            ev["node_lost"] = True
        return LoopEnd.SANDBOX_DIED, ev
    if sb.host_stalled:
        return LoopEnd.HOST_ERROR, {**ev, "host_stalled": True}
    if not returned and gw is not None and not gw.healthy:
        return LoopEnd.INFERENCE_ERROR, {**ev, "why": "the gateway's health probe failed"}
    if ses.context_refusals and ses.ok == 0:  # the agent's first prompt leaves no room
        return LoopEnd.PROMPT_TOO_LONG, {**ev, "prompt_tokens": ses.context_refusals[-1]}
    if not returned and ses.context_refusals:
        return LoopEnd.CONTEXT, {**ev, "prompt_tokens": ses.context_refusals[-1]}
    if not returned and ses.engine_errors:
        return LoopEnd.INFERENCE_ERROR, {**ev, "why": "the engine failed a request of the agent"}
    if ses.ok == 0:
        return LoopEnd.AGENT_NO_MODEL_CALL, ev
    if run.end is AgentEnd.TIMED_OUT or sb.budget_exhausted:
        return LoopEnd.BUDGET, ev
    if not returned:
        return LoopEnd.AGENT_ERROR, ev
    return LoopEnd.DONE, ev
