"""One key per attempt (no attempt reads or writes another's requests or tokens), prefix
reuse exact across resent histories, edits recorded as new segments."""

from __future__ import annotations

from typing import Any

import pytest
from gateway_rig import QWEN_LIKE, ChatFakeTokenizer, make_rig
from openai import AuthenticationError

from rollbank.chat.template import ChatTemplate
from rollbank.clock import FakeClock
from rollbank.errors import GatewayError
from rollbank.gateway.sessions import SessionTable
from rollbank.gateway.transcript import ChatTranscript, classify_edit


def test_table_keys_select_one_session_and_closed_keys_fail() -> None:
    t = SessionTable(FakeClock())
    a, ka = t.open("A", "g", model="m")
    b, kb = t.open("B", "g", model="m")
    assert t.lookup(ka) is a and t.lookup(kb) is b
    assert t.lookup(ka, a.session_id) is a
    with pytest.raises(GatewayError) as e:
        t.lookup(ka, b.session_id)  # A's key on B's URL
    assert e.value.status == 401
    for bad in (None, "", "rb-guess", ka + "x", ka[:-1]):
        with pytest.raises(GatewayError):
            t.lookup(bad)
    with pytest.raises(GatewayError):
        t.open("A", "g", model="m")  # one open session per attempt
    t.close(a.session_id)
    with pytest.raises(GatewayError):
        t.lookup(ka)
    assert t.lookup(kb) is b


async def test_attempts_cannot_read_or_write_each_other() -> None:
    rig = make_rig()
    ha = rig.gateway.open_session("A", "g")
    hb = rig.gateway.open_session("B", "g")
    rig.replies += ["for A", "for B"]
    await rig.client(ha).chat.completions.create(model="m", messages=[{"role": "user", "content": "I am A"}])
    # B's key on A's URL is refused: nothing of B lands in A, nothing of A is answered to B
    with pytest.raises(AuthenticationError):
        await rig.client(hb, base_url=ha.base_url).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "I am B"}])
    with pytest.raises(AuthenticationError):
        await rig.client(ha, base_url=ha.base_url.replace(ha.session_id, hb.session_id)).models.list()
    # the key alone (plain /v1) selects its own session only
    await rig.client(hb, base_url="http://gw/v1").chat.completions.create(
        model="m", messages=[{"role": "user", "content": "I am B"}])
    # a forged or missing key: 401 before any generation
    async with rig.http() as http:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": ha.api_key}):
            r = await http.post(f"{ha.base_url}/chat/completions", headers=headers,
                                json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    ra = await rig.gateway.close_session(ha)
    rb = await rig.gateway.close_session(hb)
    assert [bytes(r.prompt_token_ids).decode().count("I am A") for r in ra.requests] == [1]
    assert [bytes(r.prompt_token_ids).decode().count("I am B") for r in rb.requests] == [1]
    assert b"I am B" not in bytes(t for t in ra.tokens["token_ids"] if t < 256)
    assert b"I am A" not in bytes(t for t in rb.tokens["token_ids"] if t < 256)
    assert len(rig.seen) == 2  # the refused requests never reached an engine


async def test_resent_history_reuses_held_ids_exactly() -> None:
    rig = make_rig()
    h = rig.gateway.open_session("A", "g")
    c = rig.client(h)
    rig.replies += ["first answer", "second answer", "third"]
    msgs: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "one"}]
    for turn in ("two", "three"):
        r = await c.chat.completions.create(model="m", messages=msgs)
        msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": turn}]
    await c.chat.completions.create(model="m", messages=msgs)
    rec = await rig.gateway.close_session(h)
    r0, r1, r2 = rec.requests
    assert [r.segment for r in rec.requests] == [0, 0, 0] and len(rec.segments) == 1
    # each prompt is the previous prompt + the engine's own ids + only the template's delta
    for prev, nxt in ((r0, r1), (r1, r2)):
        held = prev.prompt_token_ids + prev.output_token_ids
        assert nxt.prompt_token_ids[:len(held)] == held
        assert nxt.reused_prompt_tokens == len(held)
        delta = bytes(nxt.prompt_token_ids[len(held):]).decode()
        # (the fake's EOS decodes to no text, so the template's <|im_end|> is part of the delta)
        assert delta.startswith("<|im_end|>\n<|im_start|>user\n")
        assert delta.endswith("<|im_end|>\n<|im_start|>assistant\n")
    assert rec.tokens["token_ids"] == r2.prompt_token_ids + r2.output_token_ids
    assert rec.edits == []


async def test_edited_history_records_the_edit_and_a_new_segment() -> None:
    rig = make_rig()
    h = rig.gateway.open_session("A", "g")
    c = rig.client(h)
    rig.replies += ["a1", "a2", "a3", "a4"]
    msgs: list[Any] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q1"}]
    r = await c.chat.completions.create(model="m", messages=msgs)
    msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "q2"}]
    await c.chat.completions.create(model="m", messages=msgs)
    summary: list[Any] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "summary: q1 a1; q2"}]
    await c.chat.completions.create(model="m", messages=summary)  # the agent summarised
    await c.chat.completions.create(model="m", messages=[{"role": "system", "content": "NEW sys"},
                                                         *summary[1:]])
    rec = await rig.gateway.close_session(h)
    assert [r.segment for r in rec.requests] == [0, 0, 1, 2]
    assert [e["reason"] for e in rec.edits] == ["edited", "edited"]
    assert rec.edits[1]["at_message"] == 0
    # a new segment starts from the full rendering, recorded after everything before it
    seg1 = rec.segments[1]
    r2 = rec.requests[2]
    assert r2.reused_prompt_tokens == 0 and r2.edit is not None
    assert rec.tokens["token_ids"][seg1["start"]:seg1["start"] + seg1["prompt_len"]] == r2.prompt_token_ids
    assert "summary: q1 a1" in bytes(r2.prompt_token_ids).decode()


def test_classify_edit() -> None:
    held = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert classify_edit(held, held[:1], 1, True).reason == "retry"
    three = [*held, {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]
    assert classify_edit(three, three[:2], 2, True).reason == "truncated"
    assert classify_edit(held, [{"role": "user", "content": "x"}], 0, True).reason == "edited"
    assert classify_edit(held, [*held, {"role": "user", "content": "n"}], 2, False).reason == "tools_changed"


def test_retry_and_tool_change_are_new_segments() -> None:
    tr = ChatTranscript(ChatTemplate(QWEN_LIKE, use_transformers=False), ChatFakeTokenizer())
    q = [{"role": "user", "content": "q"}]
    p0 = tr.prompt(q, None)
    tr.record_model([*b"a", 257], [-0.1, -0.2], [0, 0], "a", {"role": "assistant", "content": "a"})
    p1 = tr.prompt(q, None)  # the agent sent the same request again (a client retry)
    assert p1.edit is not None and p1.edit.reason == "retry" and p1.segment == 1
    assert p1.prompt_ids == p0.prompt_ids
    tools = [{"type": "function", "function": {"name": "f"}}]
    p2 = tr.prompt(q, tools)
    assert p2.edit is not None and p2.segment == 2
    assert p2.edit.reason == "tools_changed"


async def test_concurrent_requests_of_one_session_are_serialised() -> None:
    import asyncio

    rig = make_rig()
    h = rig.gateway.open_session("A", "g")
    c = rig.client(h)
    q: list[Any] = [{"role": "user", "content": "q"}]
    await asyncio.gather(*(c.chat.completions.create(model="m", messages=q) for _ in range(3)))
    rec = await rig.gateway.close_session(h)
    assert len(rec.requests) == 3 and all(r.status == "ok" for r in rec.requests)
    n = 0
    for seg, nxt in zip(rec.segments, [*rec.segments[1:], None], strict=True):
        end = nxt["start"] if nxt else len(rec.tokens["token_ids"])
        n += rec.tokens["loss_mask"][seg["start"]:end].count(1)
    assert n == sum(len(r.output_token_ids) for r in rec.requests)
