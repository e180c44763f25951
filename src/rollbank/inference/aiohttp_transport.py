"""The engine client's wire: an ``httpx`` transport over ``aiohttp``'s connection pool.

Owns :class:`AiohttpTransport`, the default transport of
:class:`~rollbank.inference.vllm_http.VLLMHttp`. The client keeps httpx's interface (requests,
responses, per-request timeouts, ``httpx.MockTransport`` as the test seam); only the pool
under it changes: httpx's own (httpcore over anyio) spends several times aiohttp's CPU per
request, and every engine call pays it, a gateway request once more on top of the agent's own
client (``rollbank bench gateway`` measures the difference, docs/gateway.md).

What an engine call sees is unchanged: failures arrive as httpx's exceptions, so
:meth:`VLLMHttp._send <rollbank.inference.vllm_http.VLLMHttp._send>` types them as before:

- nothing could be sent (refused, unresolvable; no connection or pool slot in time):
  ``httpx.ConnectError`` / ``httpx.ConnectTimeout`` (retried by the caller);
- a read timed out: ``httpx.ReadTimeout``;
- the connection dropped, the body was cut short, the answer was not HTTP:
  ``httpx.ReadError`` / ``httpx.RemoteProtocolError`` (never re-sent).

The body is read whole inside the transport (every engine route answers one JSON document);
response headers are handed on raw, so httpx decodes a compressed body as it would its own.
Idle connections are dropped after ``keepalive_expiry_s``, before the server drops them
(vLLM: 5 s). A cancelled request closes its connection; nothing is left owned by no request.
The session belongs to the event loop that first used it; a later loop gets its own.
"""

from __future__ import annotations

import asyncio

import aiohttp
import httpx

__all__ = ["AiohttpTransport"]

# set by aiohttp from the body and the URL; httpx's own values must not be sent twice
_SKIP = frozenset({b"host", b"content-length", b"transfer-encoding", b"connection"})


class AiohttpTransport(httpx.AsyncBaseTransport):
    def __init__(self, *, max_connections: int = 256, keepalive_expiry_s: float = 2.0) -> None:
        self.max_connections = max_connections
        self.keepalive_expiry_s = keepalive_expiry_s
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _session_here(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                             keepalive_timeout=self.keepalive_expiry_s)
            # trust_env: the proxy settings of the environment apply, as they do to httpx
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  trust_env=True, skip_auto_headers=("User-Agent",))
            self._loop = loop
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session_here()
        t = request.extensions.get("timeout") or {}
        timeout = aiohttp.ClientTimeout(total=None, connect=t.get("pool"),
                                        sock_connect=t.get("connect"), sock_read=t.get("read"))
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw
                   if k.lower() not in _SKIP]
        body = await request.aread()
        what = f"{request.method} {request.url}"
        try:
            async with session.request(request.method, str(request.url), data=body or None,
                                       headers=headers, timeout=timeout, allow_redirects=False,
                                       compress=None) as resp:
                content = await resp.read()
                raw_headers = list(resp.raw_headers)
                status = resp.status
        except aiohttp.ConnectionTimeoutError as exc:  # no pool slot or no connection: nothing sent
            raise httpx.ConnectTimeout(f"{what}: connect timed out", request=request) from exc
        except TimeoutError as exc:  # aiohttp's socket read timeout (a TimeoutError too)
            raise httpx.ReadTimeout(f"{what}: read timed out", request=request) from exc
        except aiohttp.ClientConnectorError as exc:  # refused, unresolvable: nothing sent
            raise httpx.ConnectError(f"{what}: {exc}", request=request) from exc
        except aiohttp.ClientResponseError as exc:  # not an HTTP answer (bad status line, head)
            raise httpx.RemoteProtocolError(f"{what}: {exc.message}", request=request) from exc
        except aiohttp.ClientError as exc:  # dropped, reset, a body cut short
            raise httpx.ReadError(f"{what}: {exc!r}", request=request) from exc
        return httpx.Response(status, headers=raw_headers, stream=httpx.ByteStream(content),
                              request=request)

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()
