"""The HTTP routes of the collector service (FastAPI, thin: every decision is the hub's).

Every route, ``/openapi.json`` included, requires ``Authorization: Bearer <token>`` (401
otherwise, compared in constant time). Before authentication, request headers are bounded
by the HTTP parser (``service.max_header_bytes``, h11: 431/400) and bodies by
:class:`BodyLimit` (``service.max_body_bytes``: 413). A long poll whose client disconnects
gives its lease back at once (:meth:`CollectorHub.cancel`). Routes (docs/service.md; schema
docs/service-openapi.json):

    POST /v1/batches/next?timeout_s=&format=json|arrow   lease the next batch (long poll)
    POST /v1/batches/{index}/ack      {"lease_id"}         the trainer is done with it
    POST /v1/batches/{index}/release  {"lease_id"}         give it back (offered again at once)
    POST /v1/versions   {"version", "checkpoint"?, "correct"?}  announce a published weight version
    GET  /v1/status                                        run id, batch counts, version, state
    GET  /metrics                                          Prometheus text format
    GET  /openapi.json                                     this API's schema
"""


import asyncio
import hmac
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from prometheus_client import CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from rollbank.errors import ServiceError
from rollbank.extras import require
from rollbank.service.hub import MAX_WEIGHT_VERSION, CollectorHub, Finished
from rollbank.service.leases import Lease

ARROW_STREAM = "application/vnd.apache.arrow.stream"


class BatchLeaseOut(BaseModel):
    """A leased batch: acknowledge it with ``lease_id`` before ``lease_expires_in_s``."""

    batch_index: int = Field(description="the batch's index (0, 1, ...) in the run")
    lease_id: str = Field(description="what an ack or release of this hand-out must carry")
    delivery: int = Field(description="hand-outs of this batch so far (1 = first; >1 = offered again)")
    lease_expires_in_s: float = Field(description="seconds until the batch is offered again unless acknowledged")
    path: str = Field(description="the batch directory (batching/writer.py layout) on the service's machine")
    parquet: str = Field(description="its trajectories.parquet")
    rows: int = Field(description="trajectories in the batch")
    sha256: str = Field(description="sha256 of the parquet file (as in manifest.json)")
    batch: dict[str, Any] = Field(description="the manifest's batch summary (groups, accounting, versions)")


class LeaseRef(BaseModel):
    lease_id: str = Field(description="the lease id the batch was handed out with")


class AckOut(BaseModel):
    batch_index: int
    acknowledged: bool = Field(description="true: acknowledged now; false: it already was (same lease)")


class VersionIn(BaseModel):
    """A weight version the trainer published. With ``checkpoint`` the service hot-loads that
    directory on every engine it drives, then serves the version; without, the engines already
    serve it (the trainer published to them) and the service records it and tells its router."""

    version: int = Field(ge=1, le=MAX_WEIGHT_VERSION, description="the new version; greater "
                         "than the current one (at most 2**31 - 1: batches store int32)")
    checkpoint: str | None = Field(default=None, description="a directory on the service's "
                                   "machine, readable by the engines, holding full weights "
                                   "(config.json + *.safetensors, as save_pretrained writes), "
                                   "to hot-load as this version; the fake engine only records it")
    correct: bool = Field(default=False, description="true: replace a wrongly announced current "
                          "version with this one even if it is not newer (batches already "
                          "written keep the versions their tokens were tagged with)")
    lora: str | None = Field(default=None, description="instead of checkpoint: a PEFT adapter "
                             "directory readable by the engines, loaded on every engine as "
                             "policy-v<version>; the collector's requests switch to that adapter "
                             "inside the publication's pause (engines need LoRA enabled)")


class VersionOut(BaseModel):
    version: int
    checkpoint: str | None
    lora: str | None = Field(default=None, description="the adapter directory, when a LoRA version")
    applied: bool = Field(description="true: the service hot-loaded the checkpoint")
    corrected_from: int | None = Field(default=None, description="a correction: the version "
                                       "it replaced")
    detail: dict[str, Any] = Field(description="the publication's timings and engines")


class StatusOut(BaseModel):
    run_id: str
    state: Literal["starting", "collecting", "finished", "failed", "stopping"]
    error: str | None = Field(description="why the collection failed (state failed)")
    output: str | None = Field(description="the run's output folder")
    version: int = Field(description="the current weight version (0 = initial weights)")
    batches: dict[str, int] = Field(description="written, ready, leased, acked, unacked, "
                                    "redeliveries, expired, released")
    in_flight: int = Field(description="batches leased to a trainer and not acknowledged")
    ends: str = Field(description="when the service exits (e.g. once the listed batches are "
                      "acknowledged, service.exit_when_done)")
    uptime_s: float
    wall_clock: float


def _lease_body(path: str) -> dict[str, Any]:
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    (name, info), = manifest["files"].items()
    return {"path": path, "parquet": str(Path(path) / name), "rows": manifest["rows"],
            "sha256": info["sha256"], "batch": manifest.get("batch", {})}


def _arrow_bytes(path: str) -> bytes:
    import pyarrow as pa

    from rollbank.batching.loader import read_batch_dir

    table = read_batch_dir(Path(path))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue().to_pybytes())


async def _refuse(send: Any, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyLimit:
    """ASGI middleware ahead of authentication and routing: a request body over
    ``max_bytes`` is refused with 413 before the application sees it (a ``Content-Length``
    over the limit at once; a chunked body as soon as it passes the limit, never buffered
    beyond it). Bodies are small JSON: read here, then handed on."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = f"request body over service.max_body_bytes ({self.max_bytes})"
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit():
                    return await _refuse(send, 400, "malformed Content-Length")
                if int(value) > self.max_bytes:
                    return await _refuse(send, 413, too_big)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None  # the client went away
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                return await _refuse(send, 413, too_big)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        pending = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replay() -> Any:
            return pending.pop() if pending else await receive()

        await self.app(scope, replay, send)


async def _disconnected(request: Any) -> None:
    """Return when the client of ``request`` has disconnected."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _lease_for_connected(hub: CollectorHub, request: Any, timeout_s: float
                               ) -> Lease | Finished | Literal["gone"] | None:
    """The long poll, raced against the client's disconnect: a client that went away gets
    no lease (a lease granted just as it left is cancelled at once)."""
    poll = asyncio.ensure_future(hub.next_batch(timeout_s))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({poll, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        poll.cancel()  # a no-op once it has its result: a lease is never lost to the cancel
        gone.cancel()
    got = poll.result() if poll.done() and not poll.cancelled() else None
    if gone.done() and not gone.cancelled():
        if isinstance(got, Lease):
            await hub.cancel(got.batch_index, got.lease_id)
        return "gone"
    return got


def build_app(hub: CollectorHub, *, token: str, registry: CollectorRegistry,
              max_poll_s: float, max_body_bytes: int = 1 << 20) -> Any:
    """The FastAPI application serving ``hub`` (``token``: the bearer token)."""
    fastapi = require("fastapi", "service", "rollbank serve-collector")
    from fastapi import Depends, FastAPI, Query, Request, Response
    from fastapi.responses import JSONResponse
    from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

    bearer = HTTPBearer(auto_error=False, description="the service's token (service.token_file "
                        "or $ROLLBANK_SERVICE_TOKEN)")
    expected = token.encode()

    def authorized(cred: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]) -> None:
        if cred is None or not hmac.compare_digest(cred.credentials.encode(), expected):
            raise fastapi.HTTPException(401, "a valid bearer token is required",
                                        headers={"WWW-Authenticate": "Bearer"})

    app = FastAPI(title="rollbank collector service", version="1",
                  description="A long-running rollbank collection a trainer drives over HTTP "
                  "(docs/service.md).", openapi_url=None, docs_url=None, redoc_url=None,
                  dependencies=[Depends(authorized)])
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)  # runs before authentication

    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.post("/v1/batches/next", response_model=BatchLeaseOut, responses={
        200: {"content": {ARROW_STREAM: {}}, "description": "the leased batch: JSON, or with "
              "format=arrow its table as an Arrow IPC stream (lease in X-Rollbank-* headers)"},
        204: {"description": "no batch became available within timeout_s"},
        410: {"description": "the collection ended and every batch is acknowledged"}})
    async def next_batch(
        request: Request,
        timeout_s: Annotated[float, Query(ge=0, description="long-poll seconds (at most service.max_poll_s)")] = 30.0,
        format: Annotated[Literal["json", "arrow"], Query(description="json: the batch's "
                                                          "path; arrow: its table as an Arrow IPC stream")] = "json",
    ) -> Any:
        if timeout_s > max_poll_s:
            raise ServiceError(f"timeout_s {timeout_s} exceeds service.max_poll_s {max_poll_s}", status=422)
        got = await _lease_for_connected(hub, request, timeout_s)
        if got == "gone":
            return Response(status_code=499)  # nobody reads it: the lease was given back
        if got is None:
            return Response(status_code=204)
        if isinstance(got, Finished):
            return JSONResponse({"detail": f"no more batches: the collection is {got.state}",
                                 "state": got.state, "error": got.error}, status_code=410)
        try:
            body = await asyncio.to_thread(_lease_body, got.path)
            data = await asyncio.to_thread(_arrow_bytes, got.path) if format == "arrow" else None
        except Exception as exc:
            await hub.release(got.batch_index, got.lease_id)
            raise ServiceError(f"batch {got.batch_index} could not be read: {exc}") from exc
        lease = BatchLeaseOut(batch_index=got.batch_index, lease_id=got.lease_id,
                              delivery=got.delivery,
                              lease_expires_in_s=got.expires_at - hub.clock.now(), **body)
        if data is None:
            return lease
        headers = {f"X-Rollbank-{k.replace('_', '-').title()}": str(v)
                   for k, v in lease.model_dump(exclude={"batch"}).items()}
        return Response(content=data, media_type=ARROW_STREAM, headers=headers)

    @app.post("/v1/batches/{index}/ack", response_model=AckOut)
    async def ack(index: int, ref: LeaseRef) -> AckOut:
        return AckOut(batch_index=index, acknowledged=await hub.ack(index, ref.lease_id))

    @app.post("/v1/batches/{index}/release", response_model=AckOut)
    async def release(index: int, ref: LeaseRef) -> AckOut:
        await hub.release(index, ref.lease_id)
        return AckOut(batch_index=index, acknowledged=False)

    @app.post("/v1/versions", response_model=VersionOut)
    async def announce(body: VersionIn) -> VersionOut:
        if body.lora is not None and body.checkpoint is not None:
            raise ServiceError("give checkpoint (full weights) or lora (an adapter), not both",
                               status=422)
        for name, path in (("checkpoint", body.checkpoint), ("lora", body.lora)):
            if path is not None and not await asyncio.to_thread(Path(path).is_dir):
                what = ("a PEFT adapter directory" if name == "lora" else "a full-weights "
                        "directory (config.json + *.safetensors)")
                raise ServiceError(f"{name} {path} is not a directory on the service's machine: "
                                   f"send {what} the engines can read, or no {name} when the "
                                   "engines already serve the version", status=422)
        rec = await hub.announce(body.version, body.checkpoint or body.lora,
                                 lora=body.lora is not None, correct=body.correct)
        return VersionOut(version=rec.version, checkpoint=None if rec.lora else rec.checkpoint,
                          lora=rec.checkpoint if rec.lora else None, applied=rec.applied,
                          corrected_from=rec.corrected_from, detail=rec.detail)

    @app.get("/v1/status", response_model=StatusOut)
    async def status() -> StatusOut:
        return StatusOut.model_validate(hub.status())

    @app.get("/metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
    async def metrics() -> Response:
        hub.refresh_gauges()
        return Response(generate_latest(registry), media_type="text/plain; version=0.0.4")

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    return app


def openapi_schema() -> dict[str, Any]:
    """The service's OpenAPI schema (what ``GET /openapi.json`` answers; docs/service-openapi.json).

    Regenerate the committed copy with ``python -m rollbank.service.app > docs/service-openapi.json``."""
    from rollbank.clock import MonotonicClock
    from rollbank.service.leases import BatchLeases

    clock = MonotonicClock()
    hub = CollectorHub(BatchLeases(clock, lease_s=1.0), run_id="schema", max_unacked=1, clock=clock)
    schema: dict[str, Any] = build_app(hub, token="x" * 16, registry=CollectorRegistry(),
                                       max_poll_s=1.0).openapi()
    return schema


if __name__ == "__main__":
    print(json.dumps(openapi_schema(), indent=2, sort_keys=True))
