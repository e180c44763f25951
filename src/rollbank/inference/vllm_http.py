"""HTTP transport of the vLLM client: one connection pool, typed errors, retries.

Requests are made with ``httpx``'s interface over :class:`~rollbank.inference.aiohttp_transport.AiohttpTransport`
(aiohttp's pool: a fraction of httpcore's CPU per request); ``transport`` replaces it in tests.

Owns :class:`VLLMHttp`, the base of :class:`~rollbank.inference.vllm_client.VLLMClient` (and,
through it, of the SGLang client): every call goes through :meth:`VLLMHttp._send`.

A connect failure (nothing was sent) is retried ``connect_retries`` times, then
:class:`ServerUnreachableError`. Anything after the request left is never re-sent: a dropped
connection is :class:`ServerUnreachableError`, a read timeout :class:`InferenceTimeoutError`,
429/503 :class:`ServerOverloadedError`, 400/422 :class:`BadRequestError` (a 404 with an OpenAI error body too; a 404 without one, no such route, its subclass :class:`RouteMissingError`), a 500 from a
dead engine :class:`EngineDeadError`.

A caller's cancellation (an aborted attempt, a step timeout) reaches the ``httpx`` call as an
``anyio`` cancel scope's (:func:`_cancel_safely`), never as a bare ``Task.cancel()``: httpcore
1.0 loses a pool connection to the latter when it lands between the pool's assignment of a new
connection and its first request, or in the cleanup of a half-read response
(encode/httpcore#1093): the socket then stays open, owned by no request, for good.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import anyio
import httpx

from rollbank.errors import (
    BadRequestError,
    EngineDeadError,
    InferenceError,
    InferenceTimeoutError,
    RouteMissingError,
    ServerOverloadedError,
    ServerUnreachableError,
)
from rollbank.inference.aiohttp_transport import AiohttpTransport

__all__ = ["KEEPALIVE_EXPIRY_S", "VLLMHttp"]

_DEAD_MARKERS = ("enginecore", "engine core", "enginedead", "engine dead", "engine is dead")


KEEPALIVE_EXPIRY_S = 2.0

T = TypeVar("T")


async def _cancel_safely(call: Callable[[], Awaitable[T]]) -> T:
    """``await call()`` in a child task; a cancellation of the caller cancels the child's
    ``anyio`` cancel scope (which httpcore's cleanup shields honour) and waits for the child
    to unwind before it propagates, so the connection pool is left consistent (see module)."""
    scope = anyio.CancelScope()

    async def child() -> T:
        with scope:
            return await call()
        raise asyncio.CancelledError  # the scope's own cancellation, swallowed by its exit

    task = asyncio.ensure_future(child())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        scope.cancel()
        while not task.done():  # a second cancellation meanwhile changes nothing
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # retrieved: the caller's cancellation is what propagates
        raise


class VLLMHttp:
    """HTTP calls to one server. ``transport`` is the test seam (``httpx.MockTransport``)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 5.0,
        connect_retries: int = 2,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int = 256,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self.connect_retries = connect_retries
        self._http = httpx.AsyncClient(
            base_url=self._base_url,
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s),
            # httpx's own pool (and its ``limits``) is never used: the transport is aiohttp's.
            # vLLM's server closes idle keep-alive connections after 5 s
            # (VLLM_HTTP_TIMEOUT_KEEP_ALIVE); reusing one it is closing fails with "Server
            # disconnected" after any tool pause of ~5 s. Expire ours first.
            transport=transport if transport is not None else AiohttpTransport(
                max_connections=max_connections, keepalive_expiry_s=KEEPALIVE_EXPIRY_S),
        )

    @property
    def base_url(self) -> str:
        return self._base_url

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
        headers: Mapping[str, str] | None = None,
        request_id: str | None = None,
        timeout_s: float | None = None,
    ) -> httpx.Response:
        """One HTTP call with typed errors; retries only connect failures (nothing sent)."""
        kwargs: dict[str, Any] = {"json": json, "params": params, "headers": headers}
        if timeout_s is not None:
            kwargs["timeout"] = timeout_s
        attempt = 0
        while True:
            try:
                resp = await _cancel_safely(lambda: self._http.request(method, path, **kwargs))
                break
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                if attempt < self.connect_retries:
                    attempt += 1
                    await asyncio.sleep(0.1 * 2**attempt)
                    continue
                raise ServerUnreachableError(
                    f"{self._base_url}: {method} {path}: cannot connect: {exc}", server=self._base_url, request_id=request_id
                ) from exc
            except httpx.TimeoutException as exc:
                raise InferenceTimeoutError(
                    f"{self._base_url}: {method} {path}: timed out ({type(exc).__name__})",
                    server=self._base_url,
                    request_id=request_id,
                ) from exc
            except httpx.TransportError as exc:
                raise ServerUnreachableError(
                    f"{self._base_url}: {method} {path}: connection lost: {exc!r}", server=self._base_url, request_id=request_id
                ) from exc
        if resp.status_code >= 400:
            await self._raise_for_status(resp, f"{method} {path}", request_id)
        return resp

    async def _raise_for_status(self, resp: httpx.Response, what: str, request_id: str | None) -> None:
        code = resp.status_code
        body = resp.text[:500]
        msg = f"{what}: HTTP {code}: {body}"
        kw: dict[str, Any] = {"server": self._base_url, "request_id": request_id}
        if code == 404 and not _openai_error(resp.text):  # the server's own 404 (FastAPI's
            raise RouteMissingError(msg, **kw)  # {"detail": "Not Found"}): no such route
        if code in (400, 404, 422):  # 404 with an error body: e.g. no such model
            raise BadRequestError(msg, **kw)
        if any(m in body.lower() for m in _DEAD_MARKERS) or (code >= 500 and not await self.health()):
            raise EngineDeadError(msg, **kw)
        if code in (429, 503):
            raise ServerOverloadedError(msg, **kw)
        raise InferenceError(msg, **kw)

    async def health(self) -> bool:
        try:
            resp = await _cancel_safely(lambda: self._http.get("/health", timeout=5.0))
        except httpx.HTTPError:
            return False
        return resp.status_code == 200


def _openai_error(body: str) -> bool:
    """Whether a response body is an OpenAI-style error (``{"error": ...}``), as vLLM answers
    a request it refuses (a 404 so is "the model does not exist", not a missing route)."""
    try:
        data = json.loads(body)
    except ValueError:
        return False
    return isinstance(data, dict) and "error" in data
