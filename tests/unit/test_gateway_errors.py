"""What failed, per request: ``RequestRecord.error_kind`` for refusals (bad request, over a
limit), engine failures (refused prompt, death, abort) and the agent's own hang-up; and a
client that disconnects before a non-streamed (or streamed) answer cancels the engine's
generation."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from gateway_rig import call_asgi, make_rig
from openai import APIStatusError

from rollbank.gateway.config import GatewaySection

USER: Any = [{"role": "user", "content": "hi"}]


async def test_refusals_are_recorded_with_their_kind() -> None:
    rig = make_rig(config=GatewaySection(max_tokens_cap=64))
    h = rig.gateway.open_session("a", "g")
    c = rig.client(h)
    with pytest.raises(APIStatusError) as bad:
        robot: Any = [{"role": "robot", "content": "x"}]
        await c.chat.completions.create(model="m", messages=robot)
    assert bad.value.status_code == 400
    with pytest.raises(APIStatusError) as over:
        await c.chat.completions.create(model="m", messages=USER, max_tokens=65)
    assert over.value.status_code == 400 and over.value.code == "over_limit"
    await c.chat.completions.create(model="m", messages=USER)  # answered
    with pytest.raises(APIStatusError):  # the session speaks chat: wrong mode
        await c.completions.create(model="m", prompt="x", max_tokens=4)
    rec = await rig.gateway.close_session(h)
    assert [r.error_kind for r in rec.refused] == ["bad_request", "over_limit", "bad_request"]
    assert [r.kind for r in rec.refused] == ["chat", "chat", "completion"]
    assert all(r.status == "refused" and r.http_status == 400 and r.error for r in rec.refused)
    assert rec.rejected == 3
    (ok,) = rec.requests
    assert ok.status == "ok" and ok.error_kind is None and ok.http_status is None
    # written where the records go (serve-gateway's records_dir, the admin close route)
    written = json.loads(json.dumps(rec.to_dict()))
    assert [r["error_kind"] for r in written["refused"]] == ["bad_request", "over_limit", "bad_request"]
    assert written["requests"][0]["error_kind"] is None


async def test_refusals_without_a_session_are_counted_by_kind() -> None:
    rig = make_rig(config=GatewaySection(max_body_bytes=4096))
    async with rig.http() as http:
        assert (await http.post("/v1/chat/completions", content=b"x" * 5000)).status_code == 413
        assert (await http.post("/v1/chat/completions", json={"messages": USER},
                                headers={"Authorization": "Bearer nope"})).status_code == 401
        health = (await http.get("/health")).json()
    assert health["unattributed_refusals"] == {"over_limit": 1, "unauthorized": 1}


async def test_engine_failures_are_recorded_with_their_kind() -> None:
    rig = make_rig(n_servers=1)
    (server,) = rig.servers
    server.max_model_len = 40
    h = rig.gateway.open_session("a", "g")
    c = rig.client(h)
    with pytest.raises(APIStatusError) as too_long:
        await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 80}])
    assert too_long.value.code == "context_length_exceeded"
    server.max_model_len = 4096
    server.kill()
    with pytest.raises(APIStatusError) as dead:
        await c.chat.completions.create(model="m", messages=USER)
    assert dead.value.status_code == 502
    server.restart()
    rig.replies.append("y" * 200)
    server.decode_s_per_token = 0.001
    asked = asyncio.create_task(c.chat.completions.create(model="m", messages=USER))
    await server.wait_until(lambda s: s.running > 0)
    await server.pause("abort")
    with pytest.raises(APIStatusError) as aborted:
        await asked
    assert aborted.value.status_code == 503
    server.resume()
    rec = await rig.gateway.close_session(h)
    assert [(r.status, r.error_kind, r.http_status) for r in rec.requests] == [
        ("error", "context_length", 400), ("error", "engine_error", 502),
        ("aborted", "engine_aborted", 503)]


async def test_closing_the_session_mid_request_is_session_closed() -> None:
    rig = make_rig(n_servers=1)
    (server,) = rig.servers
    server.decode_s_per_token = 0.01
    rig.replies.append("z" * 400)
    h = rig.gateway.open_session("a", "g")
    asked = asyncio.create_task(rig.client(h).chat.completions.create(model="m", messages=USER))
    await server.wait_until(lambda s: s.running > 0)
    rec = await rig.gateway.close_session(h)
    with pytest.raises(APIStatusError):
        await asked
    (r,) = rec.requests
    assert (r.status, r.error_kind, r.http_status) == ("cancelled", "session_closed", 401)


@pytest.mark.parametrize("route", ["chat/completions", "completions"])
@pytest.mark.parametrize("stream", [False, True])
async def test_client_disconnect_cancels_the_engine_generation(stream: bool, route: str) -> None:
    """Regression: a non-streamed request ran to its last token after its client had gone
    (only the streamed path cancelled)."""
    rig = make_rig(n_servers=1)
    (server,) = rig.servers
    server.decode_s_per_token = 0.01  # 400 tokens: seconds of generation if not cancelled
    rig.replies.append("w" * 400)
    h = rig.gateway.open_session("a", "g")

    async def hang_up_once_generating() -> None:
        await server.wait_until(lambda s: s.running > 0)

    body: dict[str, Any] = {"model": "m", "max_tokens": 1000, "stream": stream,
                            **({"messages": USER} if route.startswith("chat") else {"prompt": "hi"})}
    status, _ = await call_asgi(rig.app, f"/s/{h.session_id}/v1/{route}", h.api_key,
                                body, hang_up_once_generating)
    assert server.running == 0  # nothing left generating for a client that is gone
    assert server.counters.generation_tokens < 400
    rec = await rig.gateway.close_session(h)
    (r,) = rec.requests
    assert (r.status, r.error_kind) == ("cancelled", "client_disconnect")
    assert r.output_token_ids == []
    assert sum(rig.gateway.router.in_flight().values()) == 0  # the router was told
    if not stream:
        assert status == 499
