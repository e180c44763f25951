"""The service's HTTP layer over an in-memory hub (httpx ASGI transport, no socket)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry
from test_batching_schema import make_batch

from rollbank.batching.loader import read_batch_dir
from rollbank.batching.writer import write_batch
from rollbank.clock import MonotonicClock
from rollbank.service.app import build_app
from rollbank.service.hub import CollectorHub
from rollbank.service.leases import BatchLeases, Lease

TOKEN = "s3cret-token-0123456789"


@dataclasses.dataclass
class Served:
    hub: CollectorHub
    app: Any
    http: httpx.AsyncClient
    applied: list[tuple[int, str | None, bool]]


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    registry = CollectorRegistry()
    hub = CollectorHub(BatchLeases(MonotonicClock(), lease_s=600), run_id="run-1", max_unacked=8,
                       clock=MonotonicClock(), registry=registry)
    app = build_app(hub, token=TOKEN, registry=registry, max_poll_s=60)
    applied: list[tuple[int, str | None, bool]] = []
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://svc",
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        yield Served(hub, app, http, applied)


def _start(s: Served) -> None:
    async def apply(version: int, checkpoint: str | None, lora: bool) -> dict[str, Any]:
        s.applied.append((version, checkpoint, lora))
        return {"servers": ["fake"]}

    s.hub.collecting(apply, "/out")


async def _written(hub: CollectorHub, root: Path, index: int) -> Path:
    batch = dataclasses.replace(make_batch(), index=index)
    path = write_batch(root, batch)
    await hub.on_batch(index, path)
    return path


def _routes(app: Any) -> list[tuple[str, str]]:
    out = []
    for r in app.routes:
        for m in sorted(getattr(r, "methods", ()) or ()):
            if m != "HEAD":
                out.append((m, r.path.replace("{index}", "0")))
    return out


async def test_every_route_refuses_a_missing_or_wrong_token(served: Served) -> None:
    routes = _routes(served.app)
    assert ("GET", "/openapi.json") in routes and ("POST", "/v1/batches/next") in routes
    assert len(routes) == 7
    for method, path in routes:
        # "" replaces the client's good default header: no credentials at all
        for auth in ("", "Bearer wrong-token-0123456789", f"Bearer {TOKEN}x", f"Basic {TOKEN}", TOKEN):
            r = await served.http.request(method, path, headers={"Authorization": auth}, json={})
            assert r.status_code == 401, (method, path, auth, r.status_code)
            assert r.headers["www-authenticate"] == "Bearer"
    assert served.hub.leases.counts()["written"] == 0


async def test_fetch_ack_loop_with_long_poll(served: Served, tmp_path: Path) -> None:
    http, hub = served.http, served.hub
    r = await http.post("/v1/batches/next", params={"timeout_s": 0})
    assert r.status_code == 204
    waiting = asyncio.create_task(http.post("/v1/batches/next", params={"timeout_s": 30}))
    await asyncio.sleep(0)
    path = await _written(hub, tmp_path, 0)
    r = await waiting  # the long poll is answered by the new batch
    assert r.status_code == 200
    lease = r.json()
    assert lease["batch_index"] == 0 and lease["delivery"] == 1 and lease["path"] == str(path)
    assert lease["rows"] == read_batch_dir(path).num_rows and 0 < lease["lease_expires_in_s"] <= 600
    assert (await http.post("/v1/batches/next", params={"timeout_s": 0})).status_code == 204
    r = await http.post("/v1/batches/0/ack", json={"lease_id": lease["lease_id"]})
    assert r.json() == {"batch_index": 0, "acknowledged": True}
    r = await http.post("/v1/batches/0/ack", json={"lease_id": lease["lease_id"]})
    assert r.json() == {"batch_index": 0, "acknowledged": False}  # a retried ack
    r = await http.post("/v1/batches/0/ack", json={"lease_id": "0-9-9"})
    assert r.status_code == 409
    r = await http.post("/v1/batches/7/ack", json={"lease_id": "x"})
    assert r.status_code == 404
    await hub.finish()
    r = await http.post("/v1/batches/next", params={"timeout_s": 30})
    assert r.status_code == 410 and r.json()["state"] == "finished"
    assert (await http.post("/v1/batches/next", params={"timeout_s": 61})).status_code == 422


async def test_release_and_arrow_stream(served: Served, tmp_path: Path) -> None:
    http = served.http
    path = await _written(served.hub, tmp_path, 0)
    lease = (await http.post("/v1/batches/next", params={"timeout_s": 0})).json()
    r = await http.post("/v1/batches/0/release", json={"lease_id": lease["lease_id"]})
    assert r.status_code == 200
    r = await http.post("/v1/batches/next", params={"timeout_s": 0, "format": "arrow"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/vnd.apache.arrow.stream"
    assert r.headers["x-rollbank-delivery"] == "2" and r.headers["x-rollbank-batch-index"] == "0"
    with pa.ipc.open_stream(r.content) as reader:
        table = reader.read_all()
    assert table.equals(read_batch_dir(path))
    assert table.schema.metadata == read_batch_dir(path).schema.metadata


async def test_versions_status_and_metrics(served: Served, tmp_path: Path) -> None:
    http, hub = served.http, served.hub
    r = await http.post("/v1/versions", json={"version": 1})
    assert r.status_code == 503  # the planes are not open yet
    _start(served)
    ckpt = tmp_path / "v1"
    ckpt.mkdir()
    r = await http.post("/v1/versions", json={"version": 1, "checkpoint": str(ckpt)})
    assert r.status_code == 200 and r.json()["applied"] is True
    assert (await http.post("/v1/versions", json={"version": 1})).status_code == 409
    assert (await http.post("/v1/versions", json={"version": 2, "checkpoint": str(tmp_path / "no")})
            ).status_code == 422
    assert (await http.post("/v1/versions", json={"version": 2, "lora": str(tmp_path / "no")})
            ).status_code == 422  # the adapter directory must exist
    assert (await http.post("/v1/versions", json={"version": 2, "lora": str(ckpt),
                                                  "checkpoint": str(ckpt)})).status_code == 422
    r = await http.post("/v1/versions", json={"version": 3})
    assert r.json()["applied"] is False
    adapter = tmp_path / "adapter-v4"
    adapter.mkdir()
    r = await http.post("/v1/versions", json={"version": 4, "lora": str(adapter)})
    assert r.status_code == 200 and r.json()["lora"] == str(adapter) and r.json()["checkpoint"] is None
    assert served.applied == [(1, str(ckpt), False), (3, None, False), (4, str(adapter), True)]
    await _written(hub, tmp_path, 0)
    await _written(hub, tmp_path, 1)
    assert (await http.post("/v1/batches/next", params={"timeout_s": 0})).status_code == 200
    status = (await http.get("/v1/status")).json()
    assert status["run_id"] == "run-1" and status["state"] == "collecting" and status["version"] == 4
    assert status["batches"]["written"] == 2 and status["in_flight"] == 1
    assert status["batches"]["ready"] == 1 and status["batches"]["acked"] == 0
    text = (await http.get("/metrics")).text
    assert 'rollbank_service_batches{state="written"} 2.0' in text
    assert "rollbank_service_weight_version 4.0" in text


async def test_backpressure_holds_the_collector_until_an_ack(tmp_path: Path) -> None:
    hub = CollectorHub(BatchLeases(MonotonicClock(), lease_s=600), run_id="r", max_unacked=1,
                       clock=MonotonicClock())
    batch = write_batch(tmp_path, dataclasses.replace(make_batch(), index=0))
    handing = asyncio.create_task(hub.on_batch(0, batch))
    await asyncio.sleep(0.05)
    assert not handing.done()  # one unacknowledged batch: the collector waits
    lease = await hub.next_batch(0)
    assert isinstance(lease, Lease)
    await hub.ack(0, lease.lease_id)
    await asyncio.wait_for(handing, 5)


async def test_stop_answers_waiting_polls(served: Served) -> None:
    waiting = asyncio.create_task(served.http.post("/v1/batches/next", params={"timeout_s": 30}))
    await asyncio.sleep(0.05)
    await served.hub.stop()
    r = await asyncio.wait_for(waiting, 5)
    assert r.status_code == 410 and r.json()["state"] == "stopping"


async def test_no_batch_is_handed_out_while_stopping(served: Served, tmp_path: Path) -> None:
    await _written(served.hub, tmp_path, 0)
    await served.hub.stop()
    r = await served.http.post("/v1/batches/next", params={"timeout_s": 0})
    assert r.status_code == 410 and served.hub.leases.counts()["leased"] == 0
