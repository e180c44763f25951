"""The HTTP routes of the collector service (FastAPI, thin: every decision is the hub's).

Every route, ``/openapi.json`` included, requires ``Authorization: Bearer <token>`` (401
otherwise, compared in constant time). Routes (docs/service.md; schema docs/service-openapi.json):

    POST /v1/batches/next?timeout_s=&format=json|arrow   lease the next batch (long poll)
    POST /v1/batches/{index}/ack      {"lease_id"}         the trainer is done with it
    POST /v1/batches/{index}/release  {"lease_id"}         give it back (offered again at once)
    POST /v1/versions   {"version", "checkpoint"?}         announce a published weight version
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
from rollbank.service.hub import CollectorHub, Finished

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

    version: int = Field(ge=1, description="the new version; greater than the current one")
    checkpoint: str | None = Field(default=None, description="full-weights safetensors directory "
                                   "readable by the engines, to hot-load as this version")
    lora: str | None = Field(default=None, description="instead of checkpoint: a PEFT adapter "
                             "directory readable by the engines, loaded on every engine as "
                             "policy-v<version>; the collector's requests switch to that adapter "
                             "inside the publication's pause (engines need LoRA enabled)")


class VersionOut(BaseModel):
    version: int
    checkpoint: str | None
    lora: str | None = Field(default=None, description="the adapter directory, when a LoRA version")
    applied: bool = Field(description="true: the service hot-loaded the checkpoint")
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


def build_app(hub: CollectorHub, *, token: str, registry: CollectorRegistry,
              max_poll_s: float) -> Any:
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

    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.post("/v1/batches/next", response_model=BatchLeaseOut, responses={
        200: {"content": {ARROW_STREAM: {}}, "description": "the leased batch: JSON, or with "
              "format=arrow its table as an Arrow IPC stream (lease in X-Rollbank-* headers)"},
        204: {"description": "no batch became available within timeout_s"},
        410: {"description": "the collection ended and every batch is acknowledged"}})
    async def next_batch(
        timeout_s: Annotated[float, Query(ge=0, description="long-poll seconds (at most service.max_poll_s)")] = 30.0,
        format: Annotated[Literal["json", "arrow"], Query(description="json: the batch's "
                                                          "path; arrow: its table as an Arrow IPC stream")] = "json",
    ) -> Any:
        if timeout_s > max_poll_s:
            raise ServiceError(f"timeout_s {timeout_s} exceeds service.max_poll_s {max_poll_s}", status=422)
        got = await hub.next_batch(timeout_s)
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
                raise ServiceError(f"{name} {path} is not a directory on the service's machine",
                                   status=422)
        rec = await hub.announce(body.version, body.checkpoint or body.lora,
                                 lora=body.lora is not None)
        return VersionOut(version=rec.version, checkpoint=None if rec.lora else rec.checkpoint,
                          lora=rec.checkpoint if rec.lora else None, applied=rec.applied,
                          detail=rec.detail)

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
