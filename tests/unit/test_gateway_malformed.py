"""Malformed requests: a 400 with an OpenAI-style body naming the field, never a crash;
size limits before authentication; the body parser fuzzed (only GatewayError escapes)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from gateway_rig import make_rig
from hypothesis import given, settings
from hypothesis import strategies as st

from rollbank.errors import GatewayError
from rollbank.gateway.config import GatewaySection
from rollbank.gateway.wire import parse_chat, parse_completion

USER = [{"role": "user", "content": "x"}]
CASES: list[tuple[Any, str | None]] = [
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": []}, "messages"),
    ({"model": "m"}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].type"),
    ({"messages": USER, "n": 3}, "n"),
    ({"messages": USER, "temperature": 9}, "temperature"),
    ({"messages": USER, "max_tokens": 0}, "max_tokens"),
    ({"messages": USER, "max_tokens": 10**9}, "max_tokens"),
    ({"messages": USER, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"description": "no name"}}]},
     "tools[0].function.name"),
    ({"messages": USER, "tool_choice": "required"}, "tool_choice"),
    ({"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice.function.name"),
    ({"messages": USER, "presence_penalty": 1.0}, "presence_penalty"),
    ({"messages": USER, "top_logprobs": 5}, "top_logprobs"),
    ({"messages": USER, "response_format": {"type": "json_object"}}, "response_format.type"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "1", "function": {}}]}]},
     "messages[0].tool_calls[0].function.name"),
]


@pytest.mark.parametrize(("body", "param"), CASES)
async def test_bad_chat_body_is_400_naming_the_field(body: Any, param: str | None) -> None:
    rig = make_rig()
    h = rig.gateway.open_session("A", "g")
    async with rig.http() as http:
        r = await http.post(f"{h.base_url}/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {h.api_key}"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert rig.seen == []


@pytest.mark.parametrize("raw", [b"", b"{", b"[1,2]", b'{"messages": NaN}', b"\xff\xfe",
                                 b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000,
                                 b'{"messages": [{"role": "user", "content": "x"}], "seed": '
                                 + b"9" * 5000 + b"}"])
async def test_undecodable_bodies_are_400(raw: bytes) -> None:
    rig = make_rig()
    h = rig.gateway.open_session("A", "g")
    async with rig.http() as http:
        for route in ("chat/completions", "completions"):
            r = await http.post(f"{h.base_url}/{route}", content=raw,
                                headers={"Authorization": f"Bearer {h.api_key}"})
            assert r.status_code == 400, (route, r.text)
            assert "error" in r.json()


async def test_size_limits_come_before_authentication() -> None:
    cfg = GatewaySection(max_header_bytes=2048, max_body_bytes=4096)
    rig = make_rig(config=cfg)
    async with rig.http() as http:
        r = await http.post("/v1/chat/completions", headers={"X-Pad": "a" * 5000},
                            json={"messages": USER})  # no key at all
        assert r.status_code == 431
        r = await http.post("/v1/chat/completions", content=b"x" * 5000)
        assert r.status_code == 413
        r = await http.post("/v1/chat/completions", content=b"{}")
        assert r.status_code == 401  # within the limits: the key check answers


async def test_completion_and_chat_do_not_mix_in_one_session() -> None:
    rig = make_rig()
    h = rig.gateway.open_session("A", "g")
    c = rig.client(h)
    await c.completions.create(model="m", prompt="hello", max_tokens=4)
    with pytest.raises(Exception, match="one session speaks one"):
        await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(Exception, match="prompt"):
        await c.completions.create(model="m", prompt="", max_tokens=4)
    rec = await rig.gateway.close_session(h)
    assert len(rec.requests) == 1 and rec.rejected == 2  # the wrong mode, the empty prompt
    assert [r.error_kind for r in rec.refused] == ["bad_request", "bad_request"]


async def test_admin_route_mints_sessions_only_with_the_token() -> None:
    rig = make_rig(admin_token="t" * 32)
    async with rig.http() as http:
        assert (await http.post("/admin/sessions")).status_code == 401
        assert (await http.post("/admin/sessions", headers={"Authorization": "Bearer x"})).status_code == 401
        r = await http.post("/admin/sessions", headers={"Authorization": "Bearer " + "t" * 32},
                            json={"attempt_id": "mine"})
        assert r.status_code == 200
        h = r.json()
        assert h["env"]["OPENAI_API_KEY"] == h["api_key"] and h["base_url"].endswith("/v1")
        r = await http.get(f"{h['base_url']}/models", headers={"Authorization": f"Bearer {h['api_key']}"})
        assert r.status_code == 200
        r = await http.delete(f"/admin/sessions/{h['session_id']}",
                              headers={"Authorization": "Bearer " + "t" * 32})
        assert r.status_code == 200 and r.json()["attempt_id"] == "mine"
    async with make_rig().http() as http:  # no admin token: minting is off
        assert (await http.post("/admin/sessions")).status_code == 401


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.sampled_from(["role", "content", "messages", "tools",
                                                              "tool_calls", "function", "name", "type",
                                                              "stop", "prompt", "max_tokens", "n"]),
                                             kids, max_size=5), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(json_values, st.binary(max_size=40))
def test_parsers_raise_only_gateway_errors(value: Any, raw: bytes) -> None:
    for body in (json.dumps(value, allow_nan=True).encode(), raw,
                 json.dumps({"messages": value}).encode(), json.dumps({"prompt": value}).encode()):
        for parse in (parse_chat, parse_completion):
            try:
                parse(body)
            except GatewayError as exc:
                assert exc.status == 400
