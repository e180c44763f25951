"""The engine client's default wire (aiohttp under httpx's interface), against a real socket
server on 127.0.0.1 that answers what each test scripts: the typed errors of
:class:`VLLMHttp` are the same as over httpx's own pool."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Awaitable, Callable

import pytest

from rollbank.errors import InferenceTimeoutError, ServerUnreachableError
from rollbank.inference.aiohttp_transport import AiohttpTransport
from rollbank.inference.vllm_http import VLLMHttp

Handler = Callable[[bytes, bytes, asyncio.StreamWriter], Awaitable[bool]]


class Server:
    """Reads one request at a time per connection (head + content-length body) and hands it
    to ``handler``; the handler writes what it likes and returns whether to keep going."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.received = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                body = await reader.readexactly(length)
                self.requests.append((head, body))
                self.received.set()
                if not await self.handler(head, body, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()


def answer(body: bytes, *, status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    return (b"HTTP/1.1 " + status + b"\r\ncontent-type: application/json\r\n" + extra
            + b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


async def _ok(head: bytes, body: bytes, w: asyncio.StreamWriter) -> bool:
    w.write(answer(json.dumps({"echo": json.loads(body or b"null")}).encode()))
    await w.drain()
    return True


def test_a_round_trip_sends_one_head_and_the_body_and_reuses_the_connection() -> None:
    async def go() -> None:
        server = Server(_ok)
        async with server as url:
            http = VLLMHttp(url, connect_retries=0)
            try:
                for i in range(3):
                    resp = await http._send("POST", "/v1/x", json={"i": i}, headers={"X-Request-Id": f"r{i}"})
                    assert resp.status_code == 200 and resp.json() == {"echo": {"i": i}}
            finally:
                await http.aclose()
        assert server.connections == 1  # kept alive
        head, body = server.requests[0]
        lines = [line.lower() for line in head.split(b"\r\n")]
        assert sum(line.startswith(b"host:") for line in lines) == 1
        assert sum(line.startswith(b"content-length:") for line in lines) == 1
        assert b"x-request-id: r0" in lines and json.loads(body) == {"i": 0}

    asyncio.run(go())


def test_an_idle_connection_is_dropped_after_the_keepalive_expiry() -> None:
    async def go() -> None:
        server = Server(_ok)
        async with server as url:
            http = VLLMHttp(url, connect_retries=0, transport=AiohttpTransport(keepalive_expiry_s=0.2))
            try:
                await http._send("GET", "/a")
                await asyncio.sleep(0.6)
                await http._send("GET", "/b")
            finally:
                await http.aclose()
        assert server.connections == 2

    asyncio.run(go())


def test_a_compressed_body_is_decoded_as_httpx_would() -> None:
    async def gz(head: bytes, body: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(answer(gzip.compress(b'{"ok": true}'), extra=b"content-encoding: gzip\r\n"))
        await w.drain()
        return True

    async def go() -> None:
        async with Server(gz) as url:
            http = VLLMHttp(url, connect_retries=0)
            try:
                assert (await http._send("GET", "/z")).json() == {"ok": True}
            finally:
                await http.aclose()

    asyncio.run(go())


def test_nothing_listening_is_unreachable_after_the_retries() -> None:
    async def go() -> None:
        async with Server(_ok) as url:
            pass  # closed: the port refuses now
        http = VLLMHttp(url, connect_retries=1)
        try:
            with pytest.raises(ServerUnreachableError, match="cannot connect"):
                await http._send("GET", "/health")
        finally:
            await http.aclose()

    asyncio.run(go())


@pytest.mark.parametrize("reply, match", [
    (b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"cut", "connection lost"),
    (b"this is not http\r\n\r\n", "connection lost"),
    (b"", "connection lost"),
])
def test_a_dropped_cut_or_garbled_answer_is_a_lost_connection(reply: bytes, match: str) -> None:
    async def bad(head: bytes, body: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(reply)
        await w.drain()
        return False  # and close

    async def go() -> None:
        async with Server(bad) as url:
            http = VLLMHttp(url, connect_retries=0)
            try:
                with pytest.raises(ServerUnreachableError, match=match):
                    await http._send("POST", "/v1/completions", json={"prompt": [1]})
            finally:
                await http.aclose()

    asyncio.run(go())


async def _silent(head: bytes, body: bytes, w: asyncio.StreamWriter) -> bool:
    await asyncio.sleep(30)
    return False


def test_no_answer_in_time_is_a_timeout() -> None:
    async def go() -> None:
        async with Server(_silent) as url:
            http = VLLMHttp(url, connect_retries=0, timeout_s=0.3)
            try:
                with pytest.raises(InferenceTimeoutError, match="timed out"):
                    await http._send("POST", "/v1/completions", json={})
            finally:
                await http.aclose()

    asyncio.run(go())


def test_a_cancelled_request_closes_its_connection_and_the_client_goes_on() -> None:
    calls = [0]

    async def first_silent(head: bytes, body: bytes, w: asyncio.StreamWriter) -> bool:
        calls[0] += 1
        if calls[0] == 1:
            return await _silent(head, body, w)
        return await _ok(head, body, w)

    async def go() -> None:
        server = Server(first_silent)
        async with server as url:
            http = VLLMHttp(url, connect_retries=0)
            try:
                task = asyncio.ensure_future(http._send("POST", "/v1/completions", json={"a": 1}))
                await server.received.wait()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                resp = await http._send("POST", "/v1/completions", json={"a": 2})
                assert resp.json() == {"echo": {"a": 2}}
                transport = http._http._transport
                assert isinstance(transport, AiohttpTransport)
                session = transport._session
                assert session is not None and session.connector is not None
                # the cancelled request's connection was closed, not returned to the pool
                assert server.connections == 2
            finally:
                await http.aclose()

    asyncio.run(go())
