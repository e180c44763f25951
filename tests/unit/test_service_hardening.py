"""The collector service cannot be wedged (issue 24, defect 2; issue 29, item 4): a long poll
whose client left leases nothing; versions are bounded to the int32 column and a wrong one
can be corrected; headers and bodies are bounded before authentication; the status says when
the service exits."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from test_batching_schema import make_batch

from rollbank.batching.writer import write_batch
from rollbank.clock import MonotonicClock
from rollbank.service.app import build_app
from rollbank.service.config import ServiceSection
from rollbank.service.hub import CollectorHub
from rollbank.service.leases import BatchLeases, BatchState

TOKEN = "s3cret-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _hub(**kw: Any) -> CollectorHub:
    clock = MonotonicClock()
    return CollectorHub(BatchLeases(clock, lease_s=600), run_id="r", max_unacked=8, clock=clock, **kw)


def _app(hub: CollectorHub) -> Any:
    return build_app(hub, token=TOKEN, registry=CollectorRegistry(), max_poll_s=60)


async def _applied(version: int, checkpoint: str | None, lora: bool) -> dict[str, Any]:
    return {"servers": ["fake"]}


async def test_a_disconnected_long_poll_leases_nothing(tmp_path: Path) -> None:
    hub = _hub()
    app = _app(hub)
    left = asyncio.Event()
    sent: list[dict[str, Any]] = []
    calls = 0

    async def receive() -> dict[str, Any]:
        nonlocal calls
        calls += 1
        if calls == 1:
            return {"type": "http.request", "body": b"", "more_body": False}
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/v1/batches/next", "raw_path": b"/v1/batches/next",
             "query_string": b"timeout_s=30", "root_path": "", "server": ("t", 80),
             "client": ("c", 1), "headers": [(b"authorization", AUTH["Authorization"].encode())]}
    polling = asyncio.create_task(app(scope, receive, send))
    await asyncio.sleep(0.2)
    left.set()  # the trainer's connection dropped mid-poll
    await asyncio.sleep(0.1)
    path = write_batch(tmp_path, dataclasses.replace(make_batch(), index=0))
    await hub.on_batch(0, path)  # a batch is written after it left: readable, leasable
    await asyncio.wait_for(polling, 5)  # the poll ended with the client, not after 30 s
    assert hub.leases.state_of(0) is BatchState.READY
    counts = hub.leases.counts()
    assert counts["leased"] == 0 and counts["released"] == 0 and counts["redeliveries"] == 0


def test_a_lease_granted_as_its_client_left_is_cancelled() -> None:
    leases = BatchLeases(MonotonicClock(), lease_s=600)
    leases.add(0, "/b0")
    first = leases.lease()
    assert first is not None
    leases.cancel(0, first.lease_id)
    again = leases.lease()
    assert again is not None and again.delivery == 1 and leases.redeliveries == 0
    leases.cancel(0, "not-the-lease")  # stale: no effect
    assert leases.state_of(0) is BatchState.LEASED
    assert leases.ack(0, again.lease_id) is True


async def test_versions_are_bounded_to_int32_and_a_wrong_one_can_be_corrected() -> None:
    hub = _hub()
    hub.collecting(_applied, "/out")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=_app(hub)),
                                 base_url="http://svc", headers=AUTH) as http:
        for too_big in (10**29, 2**31):
            assert (await http.post("/v1/versions", json={"version": too_big})).status_code == 422
        assert (await http.post("/v1/versions", json={"version": 1})).status_code == 200
        assert (await http.post("/v1/versions", json={"version": 2**31 - 1})).status_code == 200
        refused = await http.post("/v1/versions", json={"version": 2})
        assert refused.status_code == 409 and "correct" in refused.json()["detail"]
        fixed = await http.post("/v1/versions", json={"version": 2, "correct": True})
        assert fixed.status_code == 200 and fixed.json()["corrected_from"] == 2**31 - 1
        assert (await http.post("/v1/versions", json={"version": 3})).status_code == 200
        assert (await http.get("/v1/status")).json()["version"] == 3


async def test_a_large_body_is_refused_before_authentication() -> None:
    hub = _hub()
    app = build_app(hub, token=TOKEN, registry=CollectorRegistry(), max_poll_s=60,
                    max_body_bytes=4096)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://svc") as http:
        big = b"x" * 100_000
        assert (await http.post("/v1/versions", content=big)).status_code == 413  # no token

        async def chunks() -> Any:
            for _ in range(100):
                yield b"y" * 1000

        assert (await http.post("/v1/versions", content=chunks())).status_code == 413
        assert (await http.get("/v1/status")).status_code == 401  # small: authentication decides


async def test_a_huge_header_is_refused_by_the_http_parser() -> None:
    from rollbank.service.run import http_config

    hub = _hub()
    import uvicorn

    server = uvicorn.Server(http_config(_app(hub), ServiceSection.model_validate({})))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    port = sock.getsockname()[1]
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        for _ in range(100):
            if server.started:
                break
            await asyncio.sleep(0.05)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # 32 KiB of one unfinished header (twice the limit): refused at once, not buffered
        # while it grows (read in one recv: the server closes with nothing unread, so the
        # reply is not lost to a reset)
        writer.write(b"GET /v1/status HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 32768)
        await writer.drain()
        reply = await asyncio.wait_for(reader.read(200), 10)
        writer.close()
        assert reply.startswith(b"HTTP/1.1 4") and b" 401 " not in reply[:20], reply
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
        sock.close()


@pytest.mark.parametrize("exit_when_done,expect", [
    (True, "once batch(es) 0 are acknowledged"),
    (False, "keeps serving until SIGINT/SIGTERM"),
])
async def test_status_says_when_the_service_exits(exit_when_done: bool, expect: str) -> None:
    hub = _hub(exit_when_done=exit_when_done)
    assert "after the collection ends" in hub.status()["ends"]
    await hub.on_batch(0, Path("/b0"))
    await hub.finish()
    assert expect in hub.status()["ends"]


def test_the_service_exits_when_done_by_default() -> None:
    assert ServiceSection.model_validate({}).exit_when_done is True
