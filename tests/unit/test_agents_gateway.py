"""Unmodified agent programs through the real gateway over HTTP (uvicorn on 127.0.0.1) with a
scripted fake engine and fake sandboxes: mini-swe-agent (LiteLLM's OpenAI provider) and
smolagents (the openai client) complete episodes; the trajectory's tokens are the engine's."""

from __future__ import annotations

import json

from agent_rig import agent_rig
from gateway_rig import CHATML, QWEN_LIKE, make_rig

from rollbank.agents import mini_swe_agent, smolagents_agent
from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.trajectory import Trajectory
from rollbank.gateway.serve import running

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
