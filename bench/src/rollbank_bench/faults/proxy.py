"""A small asyncio HTTP fault proxy between the collector's clients and the engines.

One listener per engine target; the collector's router sees the proxy's URLs as its servers.
Each request is forwarded on a fresh upstream connection (``Connection: close``). For a
generate request whose attempt the schedule gives an engine fault at this turn (first run of
the slot only: ``r0``), the proxy instead

- ``http_5xx``: answers 503;
- ``conn_reset``: resets the client connection (TCP RST, ``SO_LINGER`` 0);
- ``slow_response``: forwards after :data:`SLOW_S` seconds (no failure expected);
- ``engine_killed``: forwards, then SIGKILLs the engine process before it answers, resets
  the client, and restarts the engine (the proxy follows it to its new port; requests that
  arrive meanwhile wait for it, as behind a supervisor that restarts its engine);
- ``target_down``: resets the client and closes this target's port for :data:`DOWN_S` s
  (each window's start and end are kept: :meth:`FaultProxy.down_intervals`; a connection
  caught in the closing listener's backlog is reset before the proxy ever reads it).

Requests that fail because a target is down or restarting are *collateral* (recorded with
their attempt id), not injected faults.

Every accepted connection is closed when its one request is done (whatever way it ends), and
:attr:`FaultProxy.conns` holds the ones not done yet: none once nothing is in flight (a
connection a client opens and never uses stays there: the soak's round end shows it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rollbank.errors import InferenceError
from rollbank.scheduling.policy.scheduler import attempt_seed
from rollbank_bench.faults.inject import FaultLog, Injection
from rollbank_bench.faults.kinds import ENGINE_KINDS, FaultKind, FaultSchedule

SLOW_S = 1.5
DOWN_S = 2.0
_RID = re.compile(r"^g(\d+)[^/]*/s(\d+)/r(\d+)/t(\d+)$")


def parse_rid(rid: str) -> tuple[int, int, int, int] | None:
    """``(seq, slot, retry, turn)`` of a runner request id ``<group>/s<slot>/r<retry>/t<turn>``."""
    m = _RID.match(rid)
    return None if m is None else (int(m[1]), int(m[2]), int(m[3]), int(m[4]))


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """One HTTP/1.1 request: (head without the final blank line, body); None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return head[:-4], body


def close_head(head: bytes) -> bytes:
    """``head`` with ``Connection: close`` instead of any connection header."""
    lines = [ln for ln in head.split(b"\r\n") if not ln.lower().startswith(b"connection:")]
    return b"\r\n".join([*lines, b"Connection: close"]) + b"\r\n\r\n"


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER on, 0 s)."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    """Listeners for ``upstreams`` (``host:port`` each); ``.urls`` once started."""

    def __init__(self, upstreams: list[tuple[str, int]], schedule: FaultSchedule, log: FaultLog,
                 *, base_seed: int, restart: Callable[[int], Awaitable[tuple[str, int]]],
                 kill: Callable[[int], None], host: str = "127.0.0.1") -> None:
        self.upstreams = list(upstreams)
        self.schedule, self.log, self.base_seed = schedule, log, base_seed
        self.restart, self.kill, self.host = restart, kill, host
        self.ports: list[int] = [0] * len(upstreams)
        self.servers: list[asyncio.Server | None] = [None] * len(upstreams)
        self.collateral: list[dict[str, Any]] = []
        self.down: dict[int, float] = {}  # target -> when its port went down (monotonic)
        self._tasks: set[asyncio.Task[None]] = set()
        #: accepted connections whose request is not done (see module doc)
        self.conns: set[asyncio.StreamWriter] = set()
        self.windows: list[dict[str, Any]] = []
        self.ready = [asyncio.Event() for _ in upstreams]
        for e in self.ready:
            e.set()

    def collateral_attempts(self) -> set[str]:
        """Attempt ids of the requests that failed as collateral."""
        return {str(c["request_id"]).rsplit("/", 1)[0] for c in self.collateral if c["request_id"]}

    def down_intervals(self) -> list[tuple[str, float, float]]:
        """``(url, start, end)`` of every port-down window, on ``time.monotonic()`` (the
        collector's clock); one still open ends at infinity."""
        urls = self.urls
        out = [(urls[w["target"]], w["t0"], w["t1"]) for w in self.windows
               if w["what"] == "port down"]
        return out + [(urls[i], t0, float("inf")) for i, t0 in self.down.items()]

    @property
    def urls(self) -> list[str]:
        return [f"http://{self.host}:{p}" for p in self.ports]

    async def __aenter__(self) -> FaultProxy:
        for i in range(len(self.upstreams)):
            await self._listen(i)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in list(self.conns):  # a client's connection still waiting: nothing comes now
            reset(w)
        for s in self.servers:
            if s is not None:
                s.close()
                with contextlib.suppress(Exception):
                    await s.wait_closed()

    async def _listen(self, i: int) -> None:
        srv = await asyncio.start_server(lambda r, w: self._serve(i, r, w), self.host,
                                         self.ports[i], reuse_address=True)
        self.ports[i] = srv.sockets[0].getsockname()[1]
        self.servers[i] = srv

    def _spawn(self, coro: Awaitable[None]) -> None:
        t = asyncio.ensure_future(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def _serve(self, i: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.conns.add(writer)
        try:
            await self._serve_one(i, reader, writer)
        finally:
            self.conns.discard(writer)
            if not writer.is_closing():  # a path that did not answer (an unexpected error)
                reset(writer)

    async def _serve_one(self, i: int, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        try:
            req = await read_request(reader)
            if req is None:
                writer.close()
                return
            head, body = req
            kind, rid = self._fault_for(body)
            if kind is not None and rid is not None:
                await self._inject(i, kind, rid, head, body, writer)
                return
            if not await self._forward(i, head, body, writer):
                self.collateral.append({"target": i, "request_id": rid, "why": "engine unreachable"})
                reset(writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            reset(writer)

    def _fault_for(self, body: bytes) -> tuple[FaultKind | None, str | None]:
        try:
            rid = json.loads(body).get("request_id") if body else None
        except (ValueError, AttributeError):
            return None, None
        parsed = parse_rid(rid) if isinstance(rid, str) else None
        if parsed is None:
            return None, rid if isinstance(rid, str) else None
        seq, slot, retry, turn = parsed
        seed = attempt_seed(self.base_seed, seq, slot)
        planned = self.schedule.planned(seed)
        if (planned is None or planned.kind not in ENGINE_KINDS or retry != 0
                or turn != planned.turn or not self.log.first(seed)):
            return None, rid
        return planned.kind, rid

    async def _forward(self, i: int, head: bytes, body: bytes, writer: asyncio.StreamWriter,
                       *, kill_first: bool = False) -> bool:
        await self.ready[i].wait()  # an engine being restarted
        host, port = self.upstreams[i]
        try:
            ur, uw = await asyncio.open_connection(host, port)
        except OSError:
            return False
        try:
            uw.write(close_head(head) + body)
            await uw.drain()
            if kill_first:
                self.ready[i].clear()
                self.kill(i)
                self._spawn(self._restart(i))
            got = False
            while chunk := await ur.read(65536):
                got = True
                writer.write(chunk)
                await writer.drain()
            if not got:
                return False
            writer.close()
            return True
        except OSError:
            return False
        finally:
            uw.close()

    async def _inject(self, i: int, kind: FaultKind, rid: str, head: bytes, body: bytes,
                      writer: asyncio.StreamWriter) -> None:
        parsed = parse_rid(rid)
        assert parsed is not None
        seed = attempt_seed(self.base_seed, parsed[0], parsed[1])
        attempt_id = rid.rsplit("/", 1)[0]
        detail: dict[str, Any] = {"target": i}
        if kind is FaultKind.HTTP_5XX:
            msg = b'{"error": "injected 503"}'
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(msg), msg))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
        elif kind is FaultKind.CONN_RESET:
            reset(writer)
        elif kind is FaultKind.SLOW_RESPONSE:
            await asyncio.sleep(SLOW_S)
            detail["delay_s"] = SLOW_S
            if not await self._forward(i, head, body, writer):  # killed / down meanwhile
                self.collateral.append({"target": i, "request_id": rid, "why": "engine unreachable"})
                reset(writer)
        elif kind is FaultKind.ENGINE_KILLED:
            ok = await self._forward(i, head, body, writer, kill_first=True)
            detail["answered_anyway"] = ok
            if not ok:
                reset(writer)
        elif kind is FaultKind.TARGET_DOWN:
            reset(writer)
            self._spawn(self._down(i))
        self.log.add(Injection(kind, seed, attempt_id, detail))

    async def _restart(self, i: int) -> None:
        """Replace killed engine ``i`` (up to 3 tries); a replacement that never comes up is
        recorded in :attr:`windows` (the requests it then fails are the campaign's own doing)."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        try:
            for attempt in range(3):
                try:
                    self.upstreams[i] = await self.restart(i)
                    break
                except InferenceError as exc:
                    self.windows.append({"target": i, "what": "engine restart failed",
                                         "try": attempt + 1, "error": str(exc)})
        finally:
            self.ready[i].set()
        self.windows.append({"target": i, "what": "engine restart", "s": round(loop.time() - t0, 2)})

    async def _down(self, i: int) -> None:
        srv = self.servers[i]
        if srv is None or i in self.down:
            return
        self.down[i] = t0 = time.monotonic()
        srv.close()
        await srv.wait_closed()
        await asyncio.sleep(DOWN_S)
        await self._listen(i)
        del self.down[i]
        self.windows.append({"target": i, "what": "port down", "s": DOWN_S,
                             "t0": t0, "t1": time.monotonic()})
