"""Serve a :class:`~rollbank.gateway.gateway.Gateway` over HTTP: uvicorn on a socket bound
before serving starts (so the URL is known and a taken port fails at once).

``running(gateway)`` is the one way in (the CLI, the benchmarks, the agents' episodes and the
tests use it): an async context manager that binds ``config.host:config.port``, sets
``gateway.root_url``, serves until the block ends, then drains. uvicorn runs the httptools
parser with the head limited to ``max_header_bytes`` (:mod:`.uvicorn_internals`: refused
with 431 once that many bytes of an incomplete head arrived, never buffered whole), or where
that protocol is unknown its h11 parser with ``h11_max_incomplete_event_size`` (the same
limit, in the parser); ``gateway.http_parser`` says which. The app's
:class:`~rollbank.gateway.app.Limits` applies the same limit to what reaches it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from typing import Any

from rollbank.errors import ServiceError
from rollbank.extras import require
from rollbank.gateway.app import build_app
from rollbank.gateway.gateway import Gateway
from rollbank.gateway.uvicorn_internals import http_protocol
from rollbank.listen import listen_tcp

LOOPBACK = ("127.0.0.1", "::1", "localhost")


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` whose accepted connections have ``TCP_NODELAY``
    (:func:`rollbank.listen.listen_tcp`); :class:`ServiceError` if it cannot be bound or
    ``host`` is not a loopback address."""
    if host not in LOOPBACK:
        raise ServiceError(f"the gateway binds loopback only (127.0.0.1), not {host!r}: its keys "
                           "are bearer tokens over plain HTTP", status=400)
    return listen_tcp(host, port, backlog=1024, port_flag="--gateway.port")


@contextlib.asynccontextmanager
async def running(gateway: Gateway, *, admin_token: str | None = None) -> AsyncIterator[str]:
    """Serve ``gateway`` while the block runs; yields its root URL (``http://127.0.0.1:PORT``)."""
    uvicorn = require("uvicorn", "service", "rollbank serve-gateway")
    cfg = gateway.config
    sock = bind(cfg.host, cfg.port)
    host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    gateway.root_url = f"http://{host}:{sock.getsockname()[1]}"
    app = build_app(gateway, admin_token=admin_token)
    http, gateway.http_parser = http_protocol(cfg.max_header_bytes)

    class _Server(uvicorn.Server):  # type: ignore[misc, name-defined]
        @contextlib.contextmanager
        def capture_signals(self) -> Any:  # the caller owns signals
            yield

    server = _Server(uvicorn.Config(app, log_level="warning", lifespan="off", http=http,
                                    h11_max_incomplete_event_size=cfg.max_header_bytes,
                                    timeout_graceful_shutdown=5, access_log=False,
                                    timeout_keep_alive=30))
    task = asyncio.create_task(server.serve(sockets=[sock]), name="rollbank-gateway-http")
    try:  # the socket listens already: connections queue until uvicorn accepts them
        yield gateway.root_url
    finally:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)
        sock.close()
