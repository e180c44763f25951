"""The fault proxy and rollbank's inference client leave no connection behind when requests
are cancelled mid-flight (the faulted soak's agent rounds cancel engine requests whenever an
agent hangs, is killed or times out, and every round's close cancels the stragglers').

The 30-minute faulted soak with agent rounds grew by TCP connections between the inference
client and the proxy's listeners: a cancellation that lands between httpcore's pool handing a
request a new connection and its first write (or in the cleanup of a half-read answer) left
the connection open and owned by nobody (encode/httpcore#1093) — the proxy waiting for a
request that never came, or the client never closing a connection the proxy had closed.
Here requests are cancelled at every point of their life in turn (after 0, 1, 2, ... loop
steps), through a real proxy on real sockets; afterwards neither side holds a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from rollbank.inference.vllm_http import KEEPALIVE_EXPIRY_S, VLLMHttp
from rollbank_bench.faults.inject import FaultLog
from rollbank_bench.faults.kinds import FaultSchedule
from rollbank_bench.faults.proxy import FaultProxy, read_request
from rollbank_bench.soak_probe import describe_fds

ANSWER = b'{"ok": true}'
#: loop steps before each cancellation: 0 to 79 covers connect, the request's write, the
#: proxy's forward and the answer's read (a request here takes about 40 steps)
STEPS = 80
ROUNDS = 3
#: seconds a closed connection may stay in the client's pool: aiohttp drops an idle one at its
#: next keep-alive sweep, which runs every expiry, so up to two expiries after its last use
POOL_LINGER_S = 2 * KEEPALIVE_EXPIRY_S


async def _engine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """An engine that answers every request after a few loop steps."""
    try:
        if await read_request(reader) is None:
            return
        for _ in range(3):
            await asyncio.sleep(0)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                     b"Connection: close\r\n\r\n%s" % (len(ANSWER), ANSWER))
        await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


def _client_sockets(port: int, before: frozenset[str] = frozenset()) -> list[str]:
    """This process's TCP descriptors connected to ``port`` (the client's side), except those
    in ``before`` (an earlier test's socket to a server that had this port number)."""
    return [f for f in describe_fds()["fds"]
            if " tcp " in f and f"->:{port} " in f and f not in before]


async def _settled(proxy: FaultProxy, port: int,
                   before: frozenset[str]) -> tuple[set[asyncio.StreamWriter], list[str]]:
    """The proxy's open connections and the client's sockets once closes in progress are done:
    a bounded wait for them (the pool's linger and a margin for a loaded host), not a timing
    check: a leaked one never goes."""
    deadline = time.monotonic() + POOL_LINGER_S + 5.0
    while time.monotonic() < deadline:
        if not proxy.conns and not _client_sockets(port, before):
            break
        await asyncio.sleep(0.05)
    return set(proxy.conns), _client_sockets(port, before)


async def test_cancelled_requests_leave_no_connection_on_either_side() -> None:
    engine = await asyncio.start_server(_engine, "127.0.0.1", 0)
    upstream = ("127.0.0.1", engine.sockets[0].getsockname()[1])

    async def no_restart(i: int) -> tuple[str, int]:
        return upstream

    proxy = FaultProxy([upstream], FaultSchedule(0, 0.0), FaultLog(), base_seed=0,
                       restart=no_restart, kill=lambda i: None)
    async with engine, proxy:
        port = proxy.ports[0]
        before = frozenset(_client_sockets(port))
        http = VLLMHttp(proxy.urls[0], connect_retries=0)
        outcomes = {"answered": 0, "cancelled": 0}
        try:
            for _ in range(ROUNDS):
                for steps in range(STEPS):
                    task = asyncio.create_task(http._send("POST", "/v1/completions",
                                                          json={"prompt": [1, 2, 3]}))
                    for _ in range(steps):
                        await asyncio.sleep(0)
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    outcomes["cancelled" if task.cancelled() else "answered"] += 1
            open_conns, client_side = await _settled(proxy, port, before)
            # control: the sweep cancels requests in flight and lets others finish
            assert outcomes["cancelled"] > STEPS and outcomes["answered"] > 0, outcomes
            assert not open_conns, f"{len(open_conns)} connections open at the proxy"
            assert not client_side, client_side
            # and the client still works
            assert (await http._send("POST", "/v1/completions", json={})).json() == {"ok": True}
        finally:
            await http.aclose()
