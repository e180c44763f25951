"""The gateway's HTTP routes (thin: every decision is the gateway's or the wire's). The three
OpenAI routes are served by :class:`OpenAIRoutes` straight from ASGI, everything else (and
those routes asked with another method: 405) by FastAPI.

Routes (``/s/<session_id>/v1/...`` is the per-attempt base URL handed out; the same routes
under ``/v1/...`` let the key alone select the session)::

    POST /v1/chat/completions     OpenAI chat completions (tools, tool_choice, stream, logprobs)
    POST /v1/completions          OpenAI completions (prompt text or token ids)
    GET  /v1/models               the served model
    POST   /admin/sessions        {"attempt_id"?, "group_id"?} -> a new session's URL and key
    DELETE /admin/sessions/{id}   close it; its record (admin token required for both)
    GET  /health                  no authentication

Order of checks on every request: the size limits (:class:`Limits`: head over
``max_header_bytes`` -> 431, body over ``max_body_bytes`` -> 413), then the key (401), then
the body (400 naming the field). Every refusal is an OpenAI-style error body
``{"error": {"message", "type", "param", "code"}}``; an unexpected failure is a 500 with the
same shape, never a dropped connection.
"""


import asyncio
import dataclasses
import hmac
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, MutableMapping
from typing import Any, TypeVar

from rollbank.errors import GatewayError
from rollbank.extras import require
from rollbank.gateway import responses as out
from rollbank.gateway import wire
from rollbank.gateway.gateway import Gateway
from rollbank.gateway.sessions import Session

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def _refuse(send: Send, status: int, message: str,
                  on_refuse: Callable[[str], None] | None = None) -> None:
    if on_refuse is not None:
        on_refuse("over_limit" if status in (413, 431) else "bad_request")
    body = json.dumps(out.error_body(GatewayError(message, status=status))).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class Limits:
    """ASGI middleware: the head and body size limits, before anything else runs (the body
    is read up to the limit and handed on whole). ``on_refuse`` is told the kind of each
    refusal (no session is known yet: these are the gateway's unattributed refusals)."""

    def __init__(self, app: ASGIApp, *, max_header_bytes: int, max_body_bytes: int,
                 on_refuse: Callable[[str], None] | None = None) -> None:
        self.app = app
        self.max_header = max_header_bytes
        self.max_body = max_body_bytes
        self.on_refuse = on_refuse

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers") or []
        head = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") \
            + sum(len(k) + len(v) + 4 for k, v in headers)
        if head > self.max_header:
            await _refuse(send, 431, f"request head of {head} bytes is over the gateway's "
                          f"limit of {self.max_header}", self.on_refuse)
            return
        declared = next((v for k, v in headers if k.lower() == b"content-length"), None)
        if declared is not None:
            if not declared.isdigit():
                await _refuse(send, 400, "invalid content-length", self.on_refuse)
                return
            if int(declared) > self.max_body:
                await _refuse(send, 413, f"body of {int(declared)} bytes is over the gateway's "
                              f"limit of {self.max_body}", self.on_refuse)
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":
                break
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_body:
                await _refuse(send, 413, f"body over the gateway's limit of {self.max_body} bytes",
                              self.on_refuse)
                return
            if not msg.get("more_body", False):
                break
        whole = b"".join(chunks)
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": whole, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def _key(headers: Any) -> str | None:
    auth = headers.get("authorization") or ""
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return str(value.strip())
    other = headers.get("x-api-key") or headers.get("api-key")
    return str(other) if other else None


def build_app(gw: Gateway, *, admin_token: str | None = None) -> Any:
    """The ASGI application serving ``gw`` (with :class:`Limits` in front)."""
    require("fastapi", "service", "rollbank serve-gateway")
    from fastapi import FastAPI, Request
    from fastapi.responses import StreamingResponse

    cfg = gw.config
    app = FastAPI(title="rollbank gateway", openapi_url=None, docs_url=None, redoc_url=None)

    async def _failed(_r: Request, exc: Exception) -> Any:
        return _error_response(exc)

    # GatewayError's own (Starlette hands an Exception handler's errors on, after answering)
    app.add_exception_handler(GatewayError, _failed)
    app.add_exception_handler(Exception, _failed)

    def session(request: Request, sid: str | None) -> Session:
        try:
            return gw.sessions.lookup(_key(request.headers), sid)
        except GatewayError:
            gw.unattributed["unauthorized"] += 1
            raise

    def admin(request: Request) -> None:
        key = _key(request.headers)
        if admin_token is None or key is None or not hmac.compare_digest(key.encode(), admin_token.encode()):
            raise GatewayError("the admin token is required" if admin_token else
                               "session minting is off (no admin token set)", status=401,
                               kind="authentication_error")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"ok": True, "sessions": len(gw.sessions),
                "unattributed_refusals": dict(gw.unattributed)}

    async def models(request: Request, sid: str | None) -> dict[str, Any]:
        s = session(request, sid)
        return out.models_body(list(dict.fromkeys([s.model, gw.model])), gw.created)

    async def chat(request: Request, sid: str | None) -> Any:
        s = session(request, sid)
        received = gw.clock.now()
        try:
            req, ignored = wire.parse_chat(await request.body(), max_depth=cfg.max_json_depth,
                                           max_messages=cfg.max_messages,
                                           max_tokens_cap=cfg.max_tokens_cap)
        except GatewayError as exc:
            gw.refuse(s, "chat", exc, received=received)
            raise
        if not req.stream:
            answer, _ = await _unless_client_leaves(request, gw.chat(s, req, ignored))
            return out.chat_response(answer)
        return StreamingResponse(_chat_stream(gw, s, req, ignored), media_type="text/event-stream")

    async def completions(request: Request, sid: str | None) -> Any:
        s = session(request, sid)
        received = gw.clock.now()
        try:
            req, ignored = wire.parse_completion(await request.body(), max_depth=cfg.max_json_depth,
                                                 max_tokens_cap=cfg.max_tokens_cap)
        except GatewayError as exc:
            gw.refuse(s, "completion", exc, received=received)
            raise
        if not req.stream:
            answer, record = await _unless_client_leaves(request, gw.complete(s, req, ignored))
            return out.completion_response(answer, record.text)
        return StreamingResponse(_completion_stream(gw, s, req, ignored), media_type="text/event-stream")

    openai_routes: dict[tuple[str, str], Handler] = {
        ("GET", "models"): models, ("POST", "chat/completions"): chat,
        ("POST", "completions"): completions}
    for (method, route), handler in openai_routes.items():  # served by OpenAIRoutes; FastAPI's
        for prefix in ("/v1", "/s/{sid}/v1"):  # copies answer another method (405)
            app.add_api_route(f"{prefix}/{route}", _bind(handler, prefix), methods=[method])

    @app.post("/admin/sessions")
    async def mint(request: Request) -> dict[str, Any]:
        admin(request)
        body = await request.body()
        data = wire.decode_body(body, max_depth=4) if body.strip() else {}
        attempt = data.get("attempt_id") or f"user-{uuid.uuid4().hex[:12]}"
        group = data.get("group_id") or attempt
        if not isinstance(attempt, str) or not isinstance(group, str):
            raise GatewayError("attempt_id and group_id must be strings", param="attempt_id")
        h = gw.open_session(attempt, group)
        return {**dataclasses.asdict(h), "env": h.env()}

    @app.delete("/admin/sessions/{sid}")
    async def close(request: Request, sid: str) -> dict[str, Any]:
        admin(request)
        if gw.sessions.by_id(sid) is None:
            raise GatewayError(f"no open session {sid!r}", status=404, param="session_id")
        return (await gw.close_session(sid)).to_dict()

    def unattributed(kind: str) -> None:
        gw.unattributed[kind] += 1

    return Limits(OpenAIRoutes(openai_routes, app), max_header_bytes=cfg.max_header_bytes,
                  max_body_bytes=cfg.max_body_bytes, on_refuse=unattributed)


Handler = Callable[[Any, str | None], Awaitable[Any]]
_OPENAI_PATH = re.compile(r"(?:/s/(?P<sid>[^/]+))?/v1/(?P<route>models|chat/completions|completions)")


def _error_response(exc: Exception) -> Any:
    """The OpenAI-style error body of a refusal (:class:`GatewayError`) or of an unexpected
    failure (500, never a dropped connection)."""
    from fastapi.responses import JSONResponse

    if not isinstance(exc, GatewayError):
        exc = GatewayError(f"internal error: {type(exc).__name__}", status=500, kind="server_error")
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
    return JSONResponse(out.error_body(exc), status_code=exc.status, headers=headers)


class OpenAIRoutes:
    """ASGI: the OpenAI routes (``GET models``, ``POST chat/completions``, ``POST completions``
    under ``/v1`` and ``/s/<sid>/v1``) served straight: a Starlette request in, the handler's
    body as a JSON (or its streaming) response out, its errors through
    :func:`_error_response`. FastAPI's routing, dependency solving and response serialisation
    cost about 0.2 ms a request here (fake engine, interleaved; within the real engine's noise).
    Everything else goes to ``app`` (FastAPI), which holds the same routes for the 405 of
    another method."""

    def __init__(self, routes: dict[tuple[str, str], Handler], app: ASGIApp) -> None:
        from starlette.requests import Request
        from starlette.responses import JSONResponse, Response

        self.routes = routes
        self.app = app
        self._request, self._json, self._response = Request, JSONResponse, Response

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        m = _OPENAI_PATH.fullmatch(scope["path"]) if scope["type"] == "http" else None
        if m is None or (handler := self.routes.get((scope["method"], m["route"]))) is None:
            await self.app(scope, receive, send)
            return
        try:
            result = await handler(self._request(scope, receive), m["sid"])
        except Exception as exc:
            result = _error_response(exc)
        response = result if isinstance(result, self._response) else self._json(result)
        await response(scope, receive, send)


def _bind(handler: Callable[[Any, str | None], Awaitable[Any]], prefix: str) -> Callable[..., Awaitable[Any]]:
    from fastapi import Request

    if "{sid}" in prefix:
        async def with_sid(request: Request, sid: str) -> Any:
            return await handler(request, sid)
        return with_sid

    async def without(request: Request) -> Any:
        return await handler(request, None)
    return without


T = TypeVar("T")


class ClientGone(GatewayError):
    """The agent closed its connection before a non-streamed answer (status 499, nginx's
    "client closed request"; nobody reads it)."""

    def __init__(self) -> None:
        super().__init__("the client closed the connection before the answer", status=499)


async def _unless_client_leaves(request: Any, work: Coroutine[Any, Any, T]) -> T:
    """``await work``, cancelled (the engine's generation with it: ``Gateway._run``) when the
    client disconnects first. The body is read already, so the next ASGI message is the
    disconnect (uvicorn sends it when the connection closes, or after the response)."""
    task = asyncio.create_task(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.create_task(disconnected())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler was cancelled: the work goes with it
        for t in (task, watcher):
            t.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)
        raise
    if task in done or watcher.exception() is not None:  # answered (or cannot tell: wait)
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        return await task
    task.cancel()  # the client went away: Gateway._run records it and cancels the engine
    await asyncio.gather(task, return_exceptions=True)
    raise ClientGone()


async def _finish(task: asyncio.Task[Any]) -> Any:
    try:
        return await task
    finally:
        if not task.done():  # the client went away mid-stream: stop the generation
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def _chat_stream(gw: Gateway, s: Session, req: wire.ChatRequest,
                       ignored: list[str]) -> AsyncIterator[bytes]:
    rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
    yield out.sse(out.chat_chunk(rid, req.model or gw.model, created,
                                 {"role": "assistant", "content": ""}))
    try:
        answer, _ = await _finish(asyncio.create_task(gw.chat(s, req, ignored)))
    except GatewayError as exc:
        yield out.sse(out.error_body(exc))
        return
    answer = dataclasses.replace(answer, response_id=rid, created=created)
    include = bool(req.stream_options and req.stream_options.include_usage)
    for chunk in out.chat_stream_tail(answer, include_usage=include):
        yield out.sse(chunk)
    yield out.sse("[DONE]")


async def _completion_stream(gw: Gateway, s: Session, req: wire.CompletionRequest,
                             ignored: list[str]) -> AsyncIterator[bytes]:
    try:
        answer, record = await _finish(asyncio.create_task(gw.complete(s, req, ignored)))
    except GatewayError as exc:
        yield out.sse(out.error_body(exc))
        return
    include = bool(req.stream_options and req.stream_options.include_usage)
    for chunk in out.completion_chunks(answer, record.text, include_usage=include):
        yield out.sse(chunk)
    yield out.sse("[DONE]")
