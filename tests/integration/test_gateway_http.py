"""The gateway on a real uvicorn on 127.0.0.1 (fake engines): the official ``openai`` client
and LiteLLM over real HTTP, a stream cut mid-response, uvicorn's own head limit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import
import litellm
from gateway_rig import make_rig

from rollbank.gateway.config import GatewaySection
from rollbank.gateway.serve import running

pytestmark = pytest.mark.integration
TOOLS: Any = [{"type": "function", "function": {"name": "shell", "parameters": {
    "type": "object", "properties": {"cmd": {"type": "string"}}}}}]


@pytest.mark.allow_slow_callbacks("LiteLLM's first call loads its provider tables synchronously")
async def test_openai_and_litellm_over_real_http() -> None:
    rig = make_rig()
    async with running(rig.gateway) as root:
        assert root.startswith("http://127.0.0.1:")
        h = rig.gateway.open_session("A", "g")
        rig.replies += ["hi from openai", '<tool_call>{"name": "shell", "arguments": {"cmd": "ls"}}'
                        "</tool_call>", "streamed"]
        c = AsyncOpenAI(base_url=h.base_url, api_key=h.api_key, max_retries=0)
        r = await c.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        assert r.choices[0].message.content == "hi from openai"
        lr: Any = await litellm.acompletion(model="openai/whatever", api_base=h.base_url,
                                            api_key=h.api_key, tools=TOOLS,
                                            messages=[{"role": "user", "content": "list"}])
        call = lr.choices[0].message.tool_calls[0]
        assert call.function.name == "shell" and lr.choices[0].finish_reason == "tool_calls"
        chunks = await litellm.acompletion(model="openai/whatever", api_base=h.base_url,
                                           api_key=h.api_key, stream=True,
                                           messages=[{"role": "user", "content": "s"}])
        text = "".join([ch.choices[0].delta.content or "" async for ch in chunks])
        assert text == "streamed"
        rec = await rig.gateway.close_session(h)
        assert [r.status for r in rec.requests] == ["ok", "ok", "ok"]
        await c.close()


async def test_stream_cut_mid_response_aborts_the_generation_and_is_recorded() -> None:
    from rollbank.inference.fake import FakeInferenceServer

    rig = make_rig(responder=lambda req: "x" * 400)
    for s in rig.servers:  # slow decoding: the cut comes while the engine generates
        s.decode_s_per_token = 0.01
    servers: list[FakeInferenceServer] = rig.servers
    async with running(rig.gateway):
        h = rig.gateway.open_session("A", "g")
        c = AsyncOpenAI(base_url=h.base_url, api_key=h.api_key, max_retries=0)
        stream = await c.chat.completions.create(model="m", stream=True, max_tokens=300,
                                                 messages=[{"role": "user", "content": "x"}])
        async for _ in stream:  # the role chunk arrives at once; then the client goes away
            break
        await stream.close()
        await c.close()
        for _ in range(200):
            if not any(s.running for s in servers):
                break
            await asyncio.sleep(0.02)
        rec = await rig.gateway.close_session(h)
        (req,) = rec.requests
        assert req.status == "cancelled"
        assert all(v == 0 for v in rig.gateway.router.in_flight().values())


async def test_uvicorn_refuses_an_oversized_head() -> None:
    rig = make_rig()
    async with running(rig.gateway) as root:
        port = int(root.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200_000 + b"\r\n\r\n")
        with contextlib.suppress(OSError):
            await writer.drain()
        head = await asyncio.wait_for(reader.read(200), timeout=10)
        assert head == b"" or b" 431 " in head or b" 400 " in head
        writer.close()


async def test_a_head_trickled_in_small_reads_is_refused_at_the_limit() -> None:
    """httptools has no head limit of its own (it would buffer a 40 MB header whole): the
    gateway's protocol answers 431 once more than ``max_header_bytes`` of an incomplete head
    arrived, long before the head ends, and serves the next connection as before."""
    rig = make_rig(config=GatewaySection(max_header_bytes=4096))
    async with running(rig.gateway) as root, httpx.AsyncClient(timeout=30) as http:
        assert rig.gateway.http_parser.startswith(("httptools", "h11"))
        port = int(root.rsplit(":", 1)[1])
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        answer = asyncio.create_task(reader.read(200))
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: ")
        sent = 0
        with contextlib.suppress(OSError):
            while sent < 1_000_000 and not answer.done():  # 1 MB in 1 KiB writes, the head
                writer.write(b"a" * 1024)  # never ended
                await writer.drain()
                sent += 1024
                await asyncio.sleep(0.001)
        head = await asyncio.wait_for(answer, timeout=10)
        assert b" 431 " in head, head
        assert sent < 500_000, sent  # refused near the limit, not at the megabyte's end
        writer.close()
        assert (await http.get(f"{root}/health")).status_code == 200
