"""The fault proxy for agent rounds: faults on the gateway's engine requests.

The gateway names its engine requests ``gw-<session>-<n>`` (no attempt in them), so the
scripted agent (:mod:`.agents`) *arms* the proxy for its own session before its request;
the session's next engine request then gets the fault instead of a plain forward:

- ``gateway_engine_reset``: the request is read, never forwarded, and the connection reset
  (TCP RST): the engine connection dropped mid-request;
- ``gateway_stream_cut``: forwarded, and the engine's answer cut after its first bytes (the
  head and part of the body reach the gateway, then a reset);
- ``gateway_engine_malformed``: answered 200 with a truncated JSON body.

Everything else is :class:`.proxy.FaultProxy`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from rollbank.scheduling.policy.scheduler import attempt_seed
from rollbank_bench.faults.inject import Injection
from rollbank_bench.faults.kinds import GATEWAY_KINDS, FaultKind
from rollbank_bench.faults.proxy import FaultProxy, close_head, reset

MALFORMED_BODY = b'{"id": "cmpl-injected", "object": "text_completion", "choices": [{"index": 0, "te'
#: bytes of the engine's answer that reach the gateway before a cut
CUT_AFTER = 64


class AgentFaultProxy(FaultProxy):
    """:class:`FaultProxy` plus per-session faults armed by the scripted agent."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.armed: dict[str, tuple[FaultKind, int, str]] = {}

    def arm(self, session_id: str, kind: FaultKind, seed: int, attempt_id: str) -> None:
        if kind not in GATEWAY_KINDS:
            raise ValueError(f"not a gateway fault: {kind.value}")
        self.armed[session_id] = (kind, seed, attempt_id)

    def disarm(self, session_id: str) -> None:
        self.armed.pop(session_id, None)

    def seed_of(self, seq: int, slot: int) -> int:
        return attempt_seed(self.base_seed, seq, slot)

    def _fault_for(self, body: bytes) -> tuple[FaultKind | None, str | None]:
        kind, rid = super()._fault_for(body)
        if kind is None and rid is not None and rid.startswith("gw-"):
            session = rid[3:].rsplit("-", 1)[0]
            armed = self.armed.get(session)
            if armed is not None:
                return armed[0], rid
        return kind, rid

    async def _inject(self, i: int, kind: FaultKind, rid: str, head: bytes, body: bytes,
                      writer: asyncio.StreamWriter) -> None:
        if kind not in GATEWAY_KINDS:
            await super()._inject(i, kind, rid, head, body, writer)
            return
        armed = self.armed.pop(rid[3:].rsplit("-", 1)[0], None)
        if armed is None:  # disarmed meanwhile: forward as usual
            if not await self._forward(i, head, body, writer):
                reset(writer)
            return
        _, seed, attempt_id = armed
        detail: dict[str, Any] = {"target": i, "request_id": rid}
        if kind is FaultKind.GATEWAY_ENGINE_RESET:
            reset(writer)
        elif kind is FaultKind.GATEWAY_ENGINE_MALFORMED:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (len(MALFORMED_BODY), MALFORMED_BODY))
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            writer.close()
        else:  # GATEWAY_STREAM_CUT
            detail["bytes_passed"] = await self._cut(i, head, body, writer)
        self.log.add(Injection(kind, seed, attempt_id, detail))

    async def _cut(self, i: int, head: bytes, body: bytes, writer: asyncio.StreamWriter) -> int:
        """Forward, pass the answer's first :data:`CUT_AFTER` bytes, reset; bytes passed."""
        await self.ready[i].wait()
        host, port = self.upstreams[i]
        passed = 0
        try:
            ur, uw = await asyncio.open_connection(host, port)
        except OSError:
            reset(writer)
            return passed
        try:
            uw.write(close_head(head) + body)
            await uw.drain()
            chunk = await ur.read(CUT_AFTER)
            writer.write(chunk)
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            passed = len(chunk)
        except OSError:
            pass
        finally:
            uw.close()
            reset(writer)
        return passed
