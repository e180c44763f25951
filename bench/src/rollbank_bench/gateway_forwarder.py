"""The floor of any HTTP gateway on this host, for ``bench gateway``: a forwarder that does
nothing but pass a request body to the engine's own route and its answer back.

It is served like the gateway (uvicorn, the same parser and head limit, a ``TCP_NODELAY``
socket, in the bench's process) and calls the engine like the gateway (httpx's interface
over :class:`~rollbank.inference.aiohttp_transport.AiohttpTransport`), so the forwarder's
latency over the direct arm is what one HTTP hop costs here whatever the gateway does, and
the gateway's latency over the forwarder's is what its own work (sessions, transcripts,
records, routing, the answer's shape) adds. Its ``/_sleep/<ms>`` route is the host's control:
how much longer the same hop takes when the handler waited ``ms`` (the process slept) than
when it answered at once. An instrument, not part of the product.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

Message = MutableMapping[str, Any]
SLEEP = "/_sleep/"


@contextlib.asynccontextmanager
async def forwarding(engine_url: str, *, max_header_bytes: int = 16384) -> AsyncIterator[str]:
    """Serve the forwarder while the block runs; yields its root URL. ``POST <root><path>``
    is sent on to ``<engine_url><path>`` with the same body; the answer comes back as is.
    ``POST <root>/_sleep/<ms>`` is the host's control: no engine, the handler sleeps ``ms``
    and answers ``{"inside_s": ...}`` (the time it spent, so a client can subtract it)."""
    import httpx
    import uvicorn

    from rollbank.gateway.serve import bind
    from rollbank.gateway.uvicorn_internals import http_protocol
    from rollbank.inference.aiohttp_transport import AiohttpTransport

    engine = httpx.AsyncClient(base_url=engine_url, timeout=120, transport=AiohttpTransport())

    async def app(scope: Message, receive: Callable[[], Awaitable[Message]],
                  send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body", False):
                break
        if scope["path"].startswith(SLEEP):  # the control: no engine, a sleep of that many ms
            t0 = time.perf_counter()
            if (ms := float(scope["path"][len(SLEEP):])) > 0:
                await asyncio.sleep(ms / 1000)
            answer = json.dumps({"inside_s": time.perf_counter() - t0}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(answer)).encode())]})
            await send({"type": "http.response.body", "body": answer})
            return
        r = await engine.post(scope["path"], content=body,
                              headers={"content-type": "application/json"})
        await send({"type": "http.response.start", "status": r.status_code,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(r.content)).encode())]})
        await send({"type": "http.response.body", "body": r.content})

    sock = bind("127.0.0.1", 0)
    http, _ = http_protocol(max_header_bytes)

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:  # the bench owns signals
            yield

    server = _Server(uvicorn.Config(app, log_level="warning", lifespan="off", http=http,
                                    access_log=False, timeout_keep_alive=30))
    task = asyncio.create_task(server.serve(sockets=[sock]), name="bench-forwarder")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
        sock.close()
        await engine.aclose()
