"""The gateway's routes against the official ``openai`` client (over the ASGI app): chat
streaming and not, tools and tool_choice, completions by text and by ids, models; and what
each request records (prompt ids sent, ids / log-probs / versions returned)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gateway_rig import CHATML, make_rig
from openai import AuthenticationError

TOOLS: Any = [{"type": "function", "function": {"name": "shell", "description": "run a command",
                                           "parameters": {"type": "object", "properties": {
                                               "cmd": {"type": "string"}}}}}]


async def test_chat_non_streaming_records_exact_ids() -> None:
    rig = make_rig()
    h = rig.gateway.open_session("g0/s0/r0", "g0", model="fake-model")
    rig.replies.append("Hello there.")
    c = rig.client(h)
    r = await c.chat.completions.create(model="fake-model", messages=[
        {"role": "user", "content": "hi"}], logprobs=True)
    assert r.choices[0].message.content == "Hello there."
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].logprobs is not None and r.choices[0].logprobs.content is not None
    rec = await rig.gateway.close_session(h)
    (req,) = rec.requests
    (sent,) = rig.seen
    assert req.prompt_token_ids == list(sent.prompt_token_ids)
    assert bytes(req.prompt_token_ids).decode() == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert req.output_token_ids[-1] == 257 and bytes(req.output_token_ids[:-1]) == b"Hello there."
    assert [t.logprob for t in r.choices[0].logprobs.content] == req.logprobs
    assert req.token_versions == [0] * len(req.output_token_ids)
    assert req.server in ("fake://s0", "fake://s1") and req.status == "ok"
    assert req.timings.total_s is not None and req.timings.ttft_s is not None
    assert rec.tokens["loss_mask"].count(1) == len(req.output_token_ids)


async def test_chat_streaming_with_tool_call() -> None:
    rig = make_rig()
    h = rig.gateway.open_session("a", "g")
    rig.replies.append('Let me look.\n<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>')
    c = rig.client(h)
    stream = await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "ls"}],
                                             tools=TOOLS, tool_choice="auto", stream=True,
                                             stream_options={"include_usage": True})
    content, finish, usage = "", None, None
    calls: list[Any] = []
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            content += ch.delta.content or ""
            calls += ch.delta.tool_calls or []
            finish = ch.finish_reason or finish
    assert content == "Let me look."
    assert [(t.function.name, json.loads(t.function.arguments or "")) for t in calls] == [
        ("shell", {"cmd": "ls"})]
    assert finish == "tool_calls"
    assert usage is not None and usage.completion_tokens > 0
    rec = await rig.gateway.close_session(h)
    assert rec.requests[0].tool_calls[0]["function"]["name"] == "shell"
    assert rec.requests[0].parse_errors == []
    assert "# Tools" in bytes(rec.requests[0].prompt_token_ids).decode()


async def test_tool_choice_none_hides_tools_and_named_choice_is_recorded() -> None:
    rig = make_rig()
    h = rig.gateway.open_session("a", "g")
    c = rig.client(h)
    rig.replies += ['<tool_call>{"name": "shell", "arguments": {}}</tool_call>', "plain"]
    r = await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}],
                                        tools=TOOLS, tool_choice="none")
    assert r.choices[0].message.tool_calls is None  # not parsed: tools were off
    r2 = await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "y"}],
                                         tools=TOOLS, tool_choice={"type": "function",
                                                                   "function": {"name": "shell"}})
    assert r2.choices[0].message.content == "plain"
    rec = await rig.gateway.close_session(h)
    assert "# Tools" not in bytes(rec.requests[0].prompt_token_ids).decode()
    assert any("not met" in e for e in rec.requests[1].parse_errors)


async def test_completions_text_and_ids_and_models() -> None:
    rig = make_rig(template=None)
    h = rig.gateway.open_session("a", "g")
    c = rig.client(h)
    rig.replies += ["42", "7"]
    r = await c.completions.create(model="m", prompt="Q: 6*7\nA: ", max_tokens=8, logprobs=0)
    assert r.choices[0].text == "42"
    assert r.choices[0].logprobs is not None and len(r.choices[0].logprobs.token_logprobs or []) == 3
    ids = list(b"Q: 6*7\nA: ") + rig.gateway.sessions.lookup(h.api_key).requests[0].output_token_ids
    r2 = await c.completions.create(model="m", prompt=ids + list(b"\nQ: 1+6\nA: "), max_tokens=8,
                                    stream=True)
    texts = [ch.choices[0].text async for ch in r2 if ch.choices]
    assert "".join(texts) == "7"
    models = await c.models.list()
    assert [m.id for m in models.data] == ["fake-model"]
    with pytest.raises(Exception, match="no chat template"):
        await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    rec = await rig.gateway.close_session(h)
    first, second = rec.requests
    assert second.segment == first.segment == 0  # the ids prompt extended the first exactly
    assert second.reused_prompt_tokens == len(first.prompt_token_ids) + len(first.output_token_ids)


async def test_chatml_template_without_tools_slot_gets_tools_in_system_prompt() -> None:
    rig = make_rig(template=CHATML)
    h = rig.gateway.open_session("a", "g")
    rig.replies.append('<tool_call>\n{"name": "shell", "arguments": {"cmd": "pwd"}}\n</tool_call>')
    r = await rig.client(h).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "where"}], tools=TOOLS)
    calls: list[Any] = list(r.choices[0].message.tool_calls or [])
    assert [c.function.name for c in calls] == ["shell"]
    rec = await rig.gateway.close_session(h)
    prompt = bytes(rec.requests[0].prompt_token_ids).decode()
    assert prompt.startswith("<|im_start|>system\n# Tools") and '"name": "shell"' in prompt


async def test_closed_key_is_401() -> None:
    rig = make_rig()
    h = rig.gateway.open_session("a", "g")
    c = rig.client(h)
    await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    await rig.gateway.close_session(h)
    with pytest.raises(AuthenticationError):
        await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
