"""The gateway's and the collector service's listening sockets: every connection they serve
has ``TCP_NODELAY``.

Without it (the listener made with ``proto=0``, which asyncio's nodelay check skips),
uvicorn's response head and body left as two writes under Nagle and each kept-alive request
waited ~40 ms for the client's delayed ACK: the whole of the gateway's "added latency" in
``rollbank bench gateway``. These tests check the socket option, not the time."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest
from gateway_rig import make_rig

from rollbank.gateway.serve import bind, running
from rollbank.service.run import bind as bind_service


def _nodelay(sock: Any) -> int:
    return int(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


@pytest.mark.parametrize("bind_socket", [bind, bind_service], ids=["gateway", "service"])
async def test_connections_accepted_on_the_bound_socket_have_tcp_nodelay(bind_socket: Any) -> None:
    seen: list[int] = []

    class Record(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            seen.append(_nodelay(transport.get_extra_info("socket")))
            transport.close()

    sock = bind_socket("127.0.0.1", 0)
    server = await asyncio.get_running_loop().create_server(Record, sock=sock)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", sock.getsockname()[1])
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert seen == [1]


async def test_served_kept_alive_connection_has_tcp_nodelay(monkeypatch: pytest.MonkeyPatch) -> None:
    from uvicorn.protocols.http.h11_impl import H11Protocol
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    served: list[int] = []
    for protocol in (H11Protocol, HttpToolsProtocol):  # whichever parser serves
        def connection_made(self: Any, transport: asyncio.Transport,
                            made: Any = protocol.connection_made) -> None:
            served.append(_nodelay(transport.get_extra_info("socket")))
            made(self, transport)

        monkeypatch.setattr(protocol, "connection_made", connection_made)
    rig = make_rig(template=None, n_servers=1)
    rig.replies += ["one", "two"]
    async with running(rig.gateway), httpx.AsyncClient(timeout=30) as http:
        h = rig.gateway.open_session("A", "g")
        for _ in range(2):  # one connection, kept alive, serves both
            r = await http.post(f"{h.base_url}/completions", json={"model": "m", "prompt": "hi"},
                                headers={"Authorization": f"Bearer {h.api_key}"})
            assert r.status_code == 200
        await rig.gateway.close_session(h)
    assert served == [1]
