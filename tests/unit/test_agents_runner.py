"""The runner's agent hook (agents/episode.py) with fake sandboxes and a fake gateway: the
trajectory is the gateway's record, and every way an agent can end is attributed to exactly
one outcome by evidence (the sandbox's and the gateway's probes), never by its output."""

from __future__ import annotations

import asyncio

from agent_rig import FakeGateway, agent_rig

from rollbank.agents.contract import LLM, AgentProcessKilled, AgentSandbox, AgentTask
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.sandbox.fake import FakeBackend, FakeSandbox


def outcome_of(t: object) -> tuple[Outcome, Reason]:
    o = getattr(t, "outcome")  # noqa: B009 - Trajectory | None narrowed below
    assert o is not None
    return o.outcome, o.reason


async def test_a_solving_agent_is_a_model_success_with_the_gateways_tokens() -> None:
    gw = FakeGateway()

    async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
        gw.call(llm, f"Task: {task.instruction}", "echo hello > /app/out.txt")
        r = await sandbox.exec("echo hello > /app/out.txt")
        gw.call(llm, f"exit {r.exit_code}", "done")

    async with agent_rig(agent, gateway=gw) as rig:
        t = await rig.run()
    assert outcome_of(t) == (Outcome.MODEL_SUCCESS, Reason.VERIFIED_PASS)
    rec = gw.closed[0]
    assert t.token_ids == rec.tokens["token_ids"]
    assert t.loss_mask == rec.tokens["loss_mask"] and sum(t.loss_mask) > 0
    assert [v for v, m in zip(t.policy_versions, t.loss_mask, strict=True) if m] == \
        [3] * sum(t.loss_mask)
    assert all(lp == 0.0 for lp, m in zip(t.logprobs, t.loss_mask, strict=True) if not m)
    assert t.prompt_len == t.loss_mask.index(1)
    assert [s.action for s in t.steps] == [None, "echo hello > /app/out.txt", None]
    assert t.meta["harness"] == "agent" and t.meta["gateway"]["requests"] == 2
    assert all(s.closed for s in gw.sessions.values())  # the session closed: key revoked
    assert gw.probes == 0  # a normal episode pays no experiment


async def test_an_agent_that_does_not_solve_is_a_verified_failure() -> None:
    gw = FakeGateway()

    async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
        gw.call(llm, "Task", "ls")
        await sandbox.exec("ls")

    async with agent_rig(agent, gateway=gw) as rig:
        t = await rig.run()
    assert outcome_of(t) == (Outcome.MODEL_FAILURE, Reason.VERIFIED_FAIL)


async def test_an_agent_crash_with_everything_healthy_is_the_agents_defect() -> None:
    gw = FakeGateway()

    async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
        gw.call(llm, "Task", "ls")
        raise KeyError("choices")

    async with agent_rig(agent, gateway=gw) as rig:
        t = await rig.run()
    assert outcome_of(t) == (Outcome.INFRA_FAILURE, Reason.AGENT_ERROR)
    assert t.outcome is not None
    ev = t.outcome.evidence
    assert ev["gateway_probe"]["healthy"] and ev["sandbox_probe"]["answered"]
    assert "KeyError" in ev["agent_error"] and gw.probes == 1


async def test_an_agent_that_never_calls_the_model_is_not_the_models_doing() -> None:
    async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
        await sandbox.exec("echo hello > /app/out.txt")  # solved without the model

    async with agent_rig(agent) as rig:
        t = await rig.run()
    assert outcome_of(t) == (Outcome.INFRA_FAILURE, Reason.AGENT_NO_MODEL_CALL)
    assert t.num_model_tokens == 0


async def test_an_agent_whose_requests_are_all_malformed_got_no_model_answer() -> None:
    gw = FakeGateway()

    async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
        gw.reject(llm)
        gw.reject(llm)
        raise ValueError("400 Bad Request")

    async with agent_rig(agent, gateway=gw) as rig:
        t = await rig.run()
    assert outcome_of(t) == (Outcome.INFRA_FAILURE, Reason.AGENT_NO_MODEL_CALL)
    assert t.outcome is not None and t.outcome.evidence["rejected_requests"] == 2


async def test_a_killed_agent_process_is_judged_by_the_probes() -> None:
    for healthy, want in ((True, Reason.AGENT_ERROR), (False, Reason.INFERENCE_ERROR)):
        gw = FakeGateway(healthy=healthy)

        async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM,
                        gw: FakeGateway = gw) -> None:
            gw.call(llm, "Task", "ls")
            raise AgentProcessKilled(9)

        async with agent_rig(agent, gateway=gw) as rig:
            t = await rig.run()
        assert outcome_of(t) == (Outcome.INFRA_FAILURE, want)
        assert t.outcome is not None and t.outcome.evidence["agent_end"] == "killed"


async def test_a_stream_cut_by_the_engine_is_an_inference_error() -> None:
    gw = FakeGateway()  # the engine is back by the time of the probe: the record decides

    async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
        gw.call(llm, "Task", "ls")
        gw.call(llm, "more", "", status="error")  # the engine's stream was cut mid-answer
        raise ConnectionError("incomplete chunked read")

    async with agent_rig(agent, gateway=gw) as rig:
        t = await rig.run()
    assert outcome_of(t) == (Outcome.INFRA_FAILURE, Reason.INFERENCE_ERROR)
    assert t.outcome is not None and t.outcome.evidence["engine_errors"]
    assert t.token_ids == gw.closed[0].tokens["token_ids"]  # the cut request adds no tokens


async def test_an_agent_that_survives_a_cut_stream_goes_on_to_be_verified() -> None:
    gw = FakeGateway()

    async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
        gw.call(llm, "Task", "", status="error")
        gw.call(llm, "Task", "echo hello > /app/out.txt")  # its retry
        await sandbox.exec("echo hello > /app/out.txt")

    async with agent_rig(agent, gateway=gw) as rig:
        t = await rig.run()
    assert outcome_of(t) == (Outcome.MODEL_SUCCESS, Reason.VERIFIED_PASS)


async def test_the_agents_timeout_is_the_models_failure_unless_the_gateway_is_down() -> None:
    for healthy, want in ((True, (Outcome.MODEL_FAILURE, Reason.BUDGET_EXHAUSTED)),
                          (False, (Outcome.INFRA_FAILURE, Reason.INFERENCE_ERROR))):
        gw = FakeGateway(healthy=healthy)

        async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM,
                        gw: FakeGateway = gw) -> None:
            gw.call(llm, "Task", "thinking")
            await asyncio.sleep(30)

        async with agent_rig(agent, gateway=gw, timeout_s=0.05) as rig:
            t = await rig.run()
        assert outcome_of(t) == want


async def test_a_timed_out_agent_that_had_solved_the_task_still_passes() -> None:
    gw = FakeGateway()

    async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
        gw.call(llm, "Task", "echo hello > /app/out.txt")
        await sandbox.exec("echo hello > /app/out.txt")
        await asyncio.sleep(30)

    async with agent_rig(agent, gateway=gw, timeout_s=0.05) as rig:
        t = await rig.run()
    assert outcome_of(t) == (Outcome.MODEL_SUCCESS, Reason.VERIFIED_PASS)


async def test_a_request_past_the_context_is_the_models_context_exhaustion() -> None:
    gw = FakeGateway()

    async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
        gw.call(llm, "Task", "ls")
        gw.call(llm, "x" * 700, "", status="error")  # refused: it no longer fits
        raise RuntimeError("context_length_exceeded")

    async with agent_rig(agent, gateway=gw, max_model_len=512) as rig:
        t = await rig.run()
    assert outcome_of(t) == (Outcome.MODEL_FAILURE, Reason.CONTEXT_EXHAUSTED)


def _wreck(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
    sb.closed = True  # the runtime is gone after this command
    return 137, b"", b""


async def test_a_sandbox_the_agents_commands_destroy_is_decided_by_the_replay() -> None:
    gw = FakeGateway()
    backend = FakeBackend(handlers={"wreck": _wreck}, files={"/app/.keep": b""})

    async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
        gw.call(llm, "Task", "wreck")
        await sandbox.exec("wreck")
        await sandbox.exec("ls")  # the runtime is gone: raises

    async with agent_rig(agent, gateway=gw, backend=backend) as rig:
        t = await rig.run()
    # the replay of the agent's commands breaks a pristine fork too: the model's doing
    assert outcome_of(t) == (Outcome.MODEL_FAILURE, Reason.SANDBOX_WRECKED)
    assert t.outcome is not None
    assert t.outcome.evidence["experiment"]["replay"]["state"] == "reproduced"


async def test_the_agents_sandbox_is_sealed_before_the_verifier_runs() -> None:
    gw = FakeGateway()
    seen: list[str] = []

    async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
        gw.call(llm, "Task", "ls")
        try:
            await sandbox.exec("sleep 30")  # cut by the agent's timeout
        finally:
            try:
                await sandbox.exec("echo hello > /app/out.txt")
            except RuntimeError as exc:
                seen.append(str(exc))

    async with agent_rig(agent, gateway=gw, timeout_s=0.05) as rig:
        t = await rig.run()
    assert outcome_of(t) == (Outcome.MODEL_FAILURE, Reason.BUDGET_EXHAUSTED)
    assert len(seen) <= 1 and rig.verifier.calls == 1


async def test_a_first_request_past_the_context_is_not_the_models_doing() -> None:
    gw = FakeGateway()  # found with smolagents: its own system prompt did not fit

    async def agent(task: AgentTask, sandbox: AgentSandbox, llm: LLM) -> None:
        gw.call(llm, "x" * 700, "", status="error")  # refused before the model said anything
        raise RuntimeError("400")

    async with agent_rig(agent, gateway=gw, max_model_len=512) as rig:
        t = await rig.run()
    assert outcome_of(t) == (Outcome.INFRA_FAILURE, Reason.PROMPT_EXCEEDS_CONTEXT)
