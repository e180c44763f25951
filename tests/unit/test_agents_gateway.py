"""Unmodified agent programs through the real gateway over HTTP (uvicorn on 127.0.0.1) with a
scripted fake engine and fake sandboxes: mini-swe-agent (LiteLLM's OpenAI provider) and
smolagents (the openai client) complete episodes; the trajectory's tokens are the engine's."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from agent_rig import agent_rig
from gateway_rig import CHATML, QWEN_LIKE, make_rig

from rollbank.agents import mini_swe_agent, smolagents_agent
from rollbank.agents.contract import AgentFn
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.gateway.serve import running
from rollbank.sandbox.fake import FakeBackend

SOLVE = "THOUGHT: write the file.\n\n```mswea_bash_command\necho hello > /app/out.txt\n```"
SUBMIT = "Done.\n\n```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"


def _model_spans(t: Trajectory) -> list[list[int]]:
    spans: list[list[int]] = []
    for i, (tok, m) in enumerate(zip(t.token_ids, t.loss_mask, strict=True)):
        if m and (i == 0 or not t.loss_mask[i - 1]):
            spans.append([])
        if m:
            spans[-1].append(tok)
    return spans


async def test_mini_swe_agent_unchanged_solves_through_the_gateway() -> None:
    rig = make_rig(template=CHATML)
    rig.replies.extend([SOLVE, SUBMIT])
    async with running(rig.gateway), agent_rig(mini_swe_agent.agent, gateway=rig.gateway) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_SUCCESS, Reason.VERIFIED_PASS)
    assert t.reward == 1.0
    seen = rig.seen
    assert len(seen) == 2  # two model calls, each prompt the engine saw extends the last
    assert list(seen[1].prompt_token_ids[:len(seen[0].prompt_token_ids)]) == \
        list(seen[0].prompt_token_ids)
    tok = rig.gateway.tokenizer
    assert [tok.decode(s) for s in _model_spans(t)] == [SOLVE, SUBMIT]
    assert t.token_ids[:len(seen[1].prompt_token_ids)] == list(seen[1].prompt_token_ids)
    assert [s.action for s in t.steps if s.action] == [
        "echo hello > /app/out.txt", "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"]
    assert all(v >= 0 for v, m in zip(t.policy_versions, t.loss_mask, strict=True) if m)


async def test_mini_swe_agent_with_a_model_that_never_formats_is_a_model_failure() -> None:
    rig = make_rig(template=CHATML)
    rig.replies.extend(["I think I should look around."] * 5)  # never a bash block
    async with running(rig.gateway), agent_rig(mini_swe_agent.agent, gateway=rig.gateway) as r:
        t = await r.run()
    assert t.outcome is not None  # its own format-error limit ends it; the verifier judges
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_FAILURE, Reason.VERIFIED_FAIL)
    assert len(rig.seen) == 3  # max_consecutive_format_errors of its settings


def _call(cmd: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "bash", "arguments": {"command": cmd}}) + \
        "\n</tool_call>"


async def test_smolagents_tool_calling_agent_solves_through_the_gateway() -> None:
    rig = make_rig(template=QWEN_LIKE)
    final = "<tool_call>\n" + json.dumps({"name": "final_answer",
                                          "arguments": {"answer": "done"}}) + "\n</tool_call>"
    rig.replies.extend([_call("echo hello > /app/out.txt"), final])
    async with running(rig.gateway), agent_rig(smolagents_agent.agent, gateway=rig.gateway,
                         options={"max_steps": 3}) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_SUCCESS, Reason.VERIFIED_PASS)
    assert [s.action for s in t.steps if s.action] == ["echo hello > /app/out.txt"]
    tok = rig.gateway.tokenizer
    assert [tok.decode(s) for s in _model_spans(t)][:1] == [_call("echo hello > /app/out.txt")]


@pytest.mark.parametrize("entry, template, replies", [
    (mini_swe_agent.agent, CHATML, [SOLVE, SUBMIT]),
    (smolagents_agent.agent, QWEN_LIKE, [_call("echo hello > /app/out.txt"), "<tool_call>\n"
                                         + json.dumps({"name": "final_answer", "arguments": {
                                             "answer": "done"}}) + "\n</tool_call>"]),
], ids=["mini-swe-agent", "smolagents"])
async def test_an_agent_program_does_not_hold_the_event_loops_default_executor(
        entry: AgentFn, template: str, replies: list[str]) -> None:
    """Regression (16 agents on vLLM never made a model call): the agents' synchronous code ran
    in the loop's default executor (``min(32, cpus + 4)`` threads: 6 here), where the loop's
    own I/O runs too (the local shell writes each command to its pipe there). Once every
    worker held an agent waiting on the loop, nothing moved until ``agent.timeout_s``. Here the
    executor has one worker and every sandbox command needs it, as the local shell's do."""
    loop = asyncio.get_running_loop()
    pool = ThreadPoolExecutor(max_workers=1)
    loop.set_default_executor(pool)
    rig = make_rig(template=template)
    rig.replies.extend(replies)
    backend = FakeBackend(files={"/app/.keep": b""}, exec_via_executor=True)
    async with running(rig.gateway), agent_rig(entry, gateway=rig.gateway, backend=backend,
                                               timeout_s=20.0, options={"max_steps": 3}) as r:
        t = await r.run()
    assert t.outcome is not None
    assert (t.outcome.outcome, t.outcome.reason) == (Outcome.MODEL_SUCCESS, Reason.VERIFIED_PASS)
