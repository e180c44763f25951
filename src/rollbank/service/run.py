"""``rollbank serve-collector``: the HTTP service and the collection it serves, in one loop.

Order: resolve the token (refuse without one), check the output folder, bind the socket
(``service.host``:``service.port``), start serving (status answers ``starting`` while the
planes open: servers start, sandboxes are prepared), then run the collection with the hub as
its batch consumer. ``<output>/service.json`` names the bound URL, run id and pid (no token);
``<output>/versions.jsonl`` records every applied version announcement.

Ends
- SIGINT/SIGTERM: long polls are answered 410, the HTTP server drains, the collection is
  cancelled (every sandbox and server released); exit 130 (SIGINT) or 143 (SIGTERM), as
  every command.
- The collection fails: its error ends the command (exit 1, or 3 for bad input) after the
  HTTP server drained (long polls are answered 410 with the error first).
- ``service.exit_when_done`` (default): once the collection finished and every batch is
  acknowledged, exit 0; status ``ends`` says which batches it still waits for.
Written batches stay on disk whatever happens; lease state lives in memory only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from rollbank.batching.batch import Batch
from rollbank.clock import Clock, MonotonicClock
from rollbank.collector import check_output_folder, collect, enter_concurrently
from rollbank.errors import ConfigError, PublicationError, ServiceError
from rollbank.extras import require
from rollbank.inference.publishing.checkpoint import CheckpointPublisher
from rollbank.inference.publishing.lora import LoraPublisher, adapter_name, routed_lora_publisher
from rollbank.inference.publishing.protocol import WeightUpdate
from rollbank.inference_plane import InferencePlane, open_inference
from rollbank.listen import listen_tcp
from rollbank.routing.factory import router_from_config
from rollbank.service.app import build_app
from rollbank.service.config import ServeCollectorConfig, resolve_token
from rollbank.service.hub import CollectorHub
from rollbank.service.leases import BatchLeases
from rollbank.signals import stop_on_signals_with
from rollbank.task_selection import select_tasks, tasks_to_prepare
from rollbank.tasks.model import Task

Say = Callable[[str], None]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` whose accepted connections have ``TCP_NODELAY``
    (:func:`rollbank.listen.listen_tcp`; :class:`ServiceError` if it cannot be bound)."""
    return listen_tcp(host, port, backlog=128, port_flag="--service.port")


def http_config(app: Any, svc: Any) -> Any:
    """The uvicorn configuration: the h11 parser with its incomplete-event limit, so request
    headers are bounded (``service.max_header_bytes``) before anything reads them (httptools,
    uvicorn's default when installed, buffers headers without a limit)."""
    import uvicorn

    return uvicorn.Config(app, log_level="warning", lifespan="off", http="h11",
                          h11_max_incomplete_event_size=svc.max_header_bytes,
                          timeout_graceful_shutdown=10)


def serve_collector(config: ServeCollectorConfig, *, say: Say) -> dict[str, Any]:
    """Serve ``config``'s collection until it ends as the module doc says; the final status
    (``signal``: the signal number that stopped it, when one did).

    Everything that can refuse (token, output folder, tasks, address) is checked before the
    event loop starts."""
    require("uvicorn", "service", "rollbank serve-collector")
    require("fastapi", "service", "rollbank serve-collector")
    svc = config.service
    token = resolve_token(svc)
    out = Path(config.output)
    check_output_folder(out)
    tasks = select_tasks(config)
    sock = bind(svc.host, svc.port)
    try:
        host = f"[{svc.host}]" if ":" in svc.host else svc.host
        url = f"http://{host}:{sock.getsockname()[1]}"
        return asyncio.run(_serve(config, tasks, token, sock, url, say))
    finally:
        sock.close()


async def _serve(config: ServeCollectorConfig, tasks: list[Task], token: str, sock: socket.socket,
                 url: str, say: Say) -> dict[str, Any]:
    import uvicorn

    from rollbank.metrics.prometheus import PrometheusSink

    svc = config.service
    out = Path(config.output)
    clock = MonotonicClock()
    prom = PrometheusSink()  # collection metrics; the hub adds its gauges to the same registry
    hub = CollectorHub(BatchLeases(clock, lease_s=svc.lease_s), run_id=uuid.uuid4().hex,
                       max_unacked=svc.max_unacked_batches, clock=clock, registry=prom.registry,
                       exit_when_done=svc.exit_when_done)
    app = build_app(hub, token=token, registry=prom.registry, max_poll_s=svc.max_poll_s,
                    max_body_bytes=svc.max_body_bytes)
    info = {"url": url, "run_id": hub.run_id, "output": str(out), "pid": os.getpid()}
    await asyncio.to_thread(_write_info, out, info)

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Any:  # ours below: drain, release, then exit 130/143
            yield

    server = _Server(http_config(app, svc))
    stopped = asyncio.Event()
    signals: list[int] = []

    def on_signal(signum: int) -> None:
        signals.append(signum)
        stopped.set()

    undo = stop_on_signals_with(on_signal)
    serving = asyncio.create_task(server.serve(sockets=[sock]), name="rollbank-service-http")
    say(json.dumps({"service": url, "run_id": hub.run_id, "output": str(out)}))
    collecting = asyncio.create_task(_collection(config, tasks, hub, prom, say),
                                     name="rollbank-service-collection")
    failure: BaseException | None = None
    try:
        await _until_end(hub, collecting, serving, stopped, exit_when_done=svc.exit_when_done)
        if collecting.done() and not collecting.cancelled():
            failure = collecting.exception()
    finally:
        undo()
        collecting.cancel()  # no batch is handed over after a stop
        if failure is None:
            await hub.stop()
        server.should_exit = True
        await asyncio.gather(serving, collecting, return_exceptions=True)
    if failure is not None:
        raise failure
    return {**hub.status(), "signal": signals[0] if signals else None}


def lora_publisher(plane: InferencePlane, publisher: CheckpointPublisher,
                   config: ServeCollectorConfig) -> Callable[[], LoraPublisher]:
    """The LoRA publisher for announced adapter versions, made on first use
    (``routed_lora_publisher``: every engine loads the adapter as ``policy-v<version>``; inside
    the publication's pause, with the same admission gate as full-weight versions, each engine's
    version label moves and its client's requests switch to the adapter). A client that cannot
    load adapters or name one is a ConfigError."""
    made: list[LoraPublisher] = []

    def get() -> LoraPublisher:
        if not made:
            managed = config.inference.managed
            made.append(routed_lora_publisher(
                list(plane.clients.values()), plan=config.service.inflight, gate=publisher.fleet.gate,
                field="inference",
                max_rank=managed.max_lora_rank if config.inference.kind == "managed" else None))
        return made[0]

    return get


def checkpoint_publisher(plane: InferencePlane, config: ServeCollectorConfig,
                         clock: Clock) -> CheckpointPublisher:
    """The publisher of announced full checkpoints: the publication seam's checkpoint pattern
    (names and shapes checked against the served model before any pause, rollback of every
    engine on a failed reload). Blocking (may fetch the model folder): run it in a thread."""
    from rollbank.inference.models import ensure_model

    inf = config.inference
    name = inf.managed.model if inf.kind == "managed" else inf.tokenizer if inf.kind == "external" else None
    model_dir = None if name is None else ensure_model(name)  # fake servers: no model folder
    return CheckpointPublisher(list(cast(Any, plane.clients.values())), model_dir,
                               plan=config.service.inflight, clock=clock)


def _append_line(path: Path, record: dict[str, Any]) -> None:
    with path.open("a") as f:
        f.write(json.dumps(record, default=str) + "\n")


def _write_info(out: Path, info: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "service.json").write_text(json.dumps(info, indent=2) + "\n")


async def _until_end(hub: CollectorHub, collecting: asyncio.Task[None], serving: asyncio.Task[None],
                     stopped: asyncio.Event, *, exit_when_done: bool) -> None:
    """Return when the service should stop: a signal, the HTTP server ended, the collection
    failed, or (``exit_when_done``) it finished and every batch is acknowledged. A finished
    collection alone does not stop the service: the trainer may still fetch and read status."""
    stop = asyncio.create_task(stopped.wait())
    done: asyncio.Task[None] | None = None
    try:
        await asyncio.wait([collecting, serving, stop], return_when=asyncio.FIRST_COMPLETED)
        if collecting.done() and not stop.done() and not serving.done() \
                and not collecting.cancelled() and collecting.exception() is None:
            waits: list[asyncio.Task[Any]] = [serving, stop]
            if exit_when_done:
                done = asyncio.create_task(hub.wait_all_acked())
                waits.append(done)
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (stop, done):
            if t is not None:
                t.cancel()
    if serving.done() and not serving.cancelled() and serving.exception() is not None:
        raise ServiceError(f"the HTTP server stopped: {serving.exception()}")


async def _collection(config: ServeCollectorConfig, tasks: list[Task], hub: CollectorHub,
                      prom: Any, say: Say) -> None:
    """Open the planes, collect with the hub as batch consumer; tell the hub how it ended."""
    from rollbank.episodes.sandboxes import open_sandboxes

    clock = hub.clock
    t_setup = time.monotonic()
    try:
        async with contextlib.AsyncExitStack() as stack:
            plane, sandboxes = await enter_concurrently(
                stack, open_inference(config.inference, max_model_len=config.runner.max_model_len),
                open_sandboxes(config.sandbox, tasks, prepare=tasks_to_prepare(config, tasks)))
            servers = list(plane.clients)
            router = router_from_config(config.router, servers, clock)
            publisher = await asyncio.to_thread(checkpoint_publisher, plane, config, clock)

            adapters = lora_publisher(plane, publisher, config)

            async def apply(version: int, checkpoint: str | None, lora: bool) -> dict[str, Any]:
                detail: dict[str, Any] = {"servers": servers}
                if checkpoint is not None and lora:
                    try:
                        pub = adapters()
                    except ConfigError as exc:
                        raise ServiceError(str(exc), status=422) from exc
                    try:
                        rec = await pub.publish(WeightUpdate(path=checkpoint, lora=True),
                                                version=version)
                    except PublicationError as exc:
                        raise ServiceError(f"LoRA version {version} from {checkpoint} failed: "
                                           f"{exc}", status=502) from exc
                    detail.update(rec.to_dict())
                    if plane.remember_adapter is not None:  # a restarted server loads it again
                        plane.remember_adapter(adapter_name(version), checkpoint, version)
                elif checkpoint is not None:
                    try:
                        rec = await publisher.publish(WeightUpdate(path=checkpoint), version=version)
                    except PublicationError as exc:  # refused before the pause, or rolled back
                        raise ServiceError(f"publication of version {version} failed: {exc}",
                                           status=502) from exc
                    detail.update(rec.to_dict())
                    if plane.remember_weights is not None:  # what a restarted server re-applies
                        plane.remember_weights(checkpoint, version)
                for server in servers:  # prefix-affinity beliefs are void after a weight change
                    router.on_weight_version(server, version)
                record = {"version": version, "checkpoint": checkpoint, "lora": lora, "at_s": clock.now(),
                          "wall_clock": time.time(), **detail}
                await asyncio.to_thread(_append_line, Path(config.output) / "versions.jsonl", record)
                return detail

            async def on_batch(batch: Batch, path: Path) -> None:
                report = batch.staleness.report if batch.staleness is not None else None
                prom.observe_staleness(batch.index, report)
                await hub.on_batch(batch.index, path)

            hub.collecting(apply, config.output)
            say(json.dumps({"collecting": True, "setup_s": round(time.monotonic() - t_setup, 1)}))
            await collect(config, tasks=tasks, inference=plane, sandboxes=sandboxes,
                          out_dir=Path(config.output), clock=clock, extra_sinks=[prom],
                          setup_s=time.monotonic() - t_setup, router=router, on_batch=on_batch)
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        await hub.finish(exc)
        raise
    await hub.finish()
