"""The gateway's driver: a request's session -> its prompt ids -> rollbank's router -> the
attempt's inference slot -> the client (which waits on its admission gate) -> the record.

Owns :class:`Gateway`. Every decision it reads is pure and lives elsewhere (the session
table, the transcripts, the router); this module only sequences them around the one await on
the engine.

Invariants
- One request of a session runs at a time (a per-session lock): the session's token state
  changes in request order, so two concurrent requests of one agent cannot interleave ids.
- Every routed request is reported back to the router exactly once: ``on_finish`` for an
  answer (or an error answer), ``on_abort`` for an abort, a transport failure or a cancel.
- Closing a session cancels its running request (the client's cancel closes the engine
  connection, which aborts it there) and records it ``cancelled``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from rollbank.chat.session import ChatTokenizer
from rollbank.chat.template import ChatTemplate
from rollbank.chat.tool_parsers import parse
from rollbank.clock import Clock
from rollbank.errors import (
    BadRequestError,
    ConfigError,
    GatewayError,
    InferenceError,
    InferenceTimeoutError,
    ServerOverloadedError,
)
from rollbank.gateway import wire
from rollbank.gateway.config import GatewaySection
from rollbank.gateway.records import (
    Kind,
    RequestRecord,
    RequestTimings,
    SessionRecord,
)
from rollbank.gateway.responses import Answer
from rollbank.gateway.sessions import Session, SessionHandle, SessionTable, SlotFactory
from rollbank.gateway.tool_prompt import ToolPromptTemplate
from rollbank.gateway.transcript import ChatTranscript, CompletionTranscript, PromptPlan
from rollbank.inference.protocol import (
    GenerateRequest,
    GenerateResult,
    InferenceClient,
    SamplingParams,
)
from rollbank.routing.router import Router, RouteRequest


class Gateway:
    """Sessions, and the chat / completion requests they carry (see the module docstring)."""

    def __init__(self, clients: Mapping[str, InferenceClient], router: Router,
                 tokenizer: ChatTokenizer, template: ChatTemplate | None, *, model: str,
                 clock: Clock, config: GatewaySection | None = None,
                 eos_token_id: int | None = None, stop_token_ids: tuple[int, ...] = ()) -> None:
        self.clients = dict(clients)
        self.router = router
        self.tokenizer = tokenizer
        self.config = config or GatewaySection()
        self.model = self.config.served_model or model
        self.clock = clock
        self.eos_token_id = eos_token_id
        self.stop_token_ids = tuple(dict.fromkeys(
            (*stop_token_ids, *((eos_token_id,) if eos_token_id is not None else ()))))
        wrap = self.config.tools_in_system_prompt
        if template is not None and (wrap == "always" or (wrap == "auto" and not template.supports_tools)):
            template = ToolPromptTemplate.wrapping(template)
        self.template = template
        self.sessions = SessionTable(clock)
        self.root_url = ""  # http://127.0.0.1:PORT, set once the server is bound
        self.http_parser = ""  # which HTTP parser serves it and why, set with root_url
        self._locks: dict[str, asyncio.Lock] = {}
        self._running: dict[str, set[asyncio.Task[GenerateResult]]] = {}
        self._ids = itertools.count()
        self.created = int(time.time())
        # awaited with each closed session's record (serve-gateway writes it to disk)
        self.on_close: Callable[[SessionRecord], Awaitable[None]] | None = None
        # refusals no session can be named for (no valid key, or refused before the key was
        # read): "unauthorized", "over_limit" (head or body size), "bad_request"
        self.unattributed: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------------ sessions
    def open_session(self, attempt_id: str, group_id: str, *, model: str | None = None,
                     slot: SlotFactory | None = None) -> SessionHandle:
        """A base URL and key for one attempt (``slot``: the attempt's inference slot,
        ``AttemptContext.inference_slot``, entered around every generation)."""
        s, key = self.sessions.open(attempt_id, group_id, model=model or self.model, slot=slot)
        self._locks[s.session_id] = asyncio.Lock()
        self._running[s.session_id] = set()
        return SessionHandle(s.session_id, attempt_id, group_id, s.model,
                             f"{self.root_url}/s/{s.session_id}/v1", key)

    async def close_session(self, session: SessionHandle | str) -> SessionRecord:
        """Close the session (its key is refused from now on), cancel its running request,
        and hand back everything it recorded."""
        sid = session if isinstance(session, str) else session.session_id
        s = self.sessions.close(sid)
        running = self._running.pop(sid, set())
        for task in running:
            task.cancel()
        if running:
            await asyncio.gather(*running, return_exceptions=True)
        self._locks.pop(sid, None)
        record = self._session_record(s)
        if self.on_close is not None:
            await self.on_close(record)
        return record

    def _session_record(self, s: Session) -> SessionRecord:
        state = s.chat if s.chat is not None else s.completion
        segments = [seg.to_dict() for seg in state.segments] if state is not None else []
        rec = state.record if state is not None else None
        tokens: dict[str, list[Any]] = {k: list(getattr(rec, k)) if rec is not None else []
                                        for k in ("token_ids", "logprobs", "loss_mask", "versions")}
        edits = [e.to_dict() for e in s.chat.edits] if s.chat is not None else []
        events = list(s.chat.session.events) if s.chat is not None else []
        return SessionRecord(s.session_id, s.attempt_id, s.group_id, s.model, s.opened_at,
                             self.clock.now(), list(s.requests), segments, tokens, edits, events,
                             rejected=s.rejected, refused=list(s.refused))

    def snapshot(self, session_id: str) -> SessionRecord | None:
        """An open session's record so far (the session stays open)."""
        s = self.sessions.by_id(session_id)
        return None if s is None else self._session_record(s)

    # ------------------------------------------------------------------ requests
    def _sampling(self, req: wire.ChatRequest | wire.CompletionRequest, max_tokens: int) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=req.temperature, top_p=req.top_p,
                              stop=req.stops(), stop_token_ids=self.stop_token_ids, logprobs=True)

    def _record(self, s: Session, kind: str, req: wire.ChatRequest | wire.CompletionRequest,
                sampling: SamplingParams, ignored: list[str], received: float) -> RequestRecord:
        rid = f"gw-{s.session_id}-{next(self._ids)}"
        sp = {"max_tokens": sampling.max_tokens, "temperature": sampling.temperature,
              "top_p": sampling.top_p, "stop": list(sampling.stop), "seed": req.seed}
        return RequestRecord(rid, "chat" if kind == "chat" else "completion", req.model,
                             req.stream, sp, RequestTimings(received), ignored_fields=ignored)

    def refuse(self, s: Session, kind: Kind, exc: GatewayError, *, received: float | None = None,
               model: str = "", stream: bool = False) -> None:
        """Record a request of ``s`` refused before generation (``SessionRecord.refused``)."""
        now = self.clock.now()
        rec = RequestRecord(f"gw-{s.session_id}-{next(self._ids)}", kind, model, stream, {},
                            RequestTimings(now if received is None else received),
                            status="refused", error=str(exc), http_status=exc.status,
                            error_kind="over_limit" if exc.code == wire.OVER_LIMIT else "bad_request")
        rec.timings.total_s = now - rec.timings.received_at
        s.refused.append(rec)

    async def chat(self, s: Session, req: wire.ChatRequest,
                   ignored: list[str]) -> tuple[Answer, RequestRecord]:
        received = self.clock.now()
        if self.template is None:
            exc = GatewayError("this gateway has no chat template for its model: use "
                               "/v1/completions", status=404, param="messages")
            self.refuse(s, "chat", exc, received=received, model=req.model, stream=req.stream)
            raise exc
        if s.completion is not None:
            exc = GatewayError("this session already serves /v1/completions; one session "
                               "speaks one of the two", param="messages")
            self.refuse(s, "chat", exc, received=received, model=req.model, stream=req.stream)
            raise exc
        sampling = self._sampling(req, req.completion_tokens(self.config.default_max_tokens))
        use_tools = bool(req.tools) and req.tool_choice != "none"
        tools = wire.tool_dicts(req.tools) if use_tools else None
        messages = [wire.template_message(m) for m in req.messages]
        async with self._locks[s.session_id]:
            if s.chat is None:
                s.chat = ChatTranscript(self.template, self.tokenizer)
            try:
                plan = s.chat.prompt(messages, tools)
            except ConfigError as exc:  # the template refused these messages
                err = GatewayError(f"the chat template cannot render these messages: "
                                   f"{exc.message}", param="messages")
                self.refuse(s, "chat", err, received=received, model=req.model, stream=req.stream)
                raise err from exc
            record = self._record(s, "chat", req, sampling, ignored, received)
            record.tool_choice = req.tool_choice if isinstance(req.tool_choice, str | None) \
                else req.tool_choice.model_dump()
            result = await self._run(s, record, plan, sampling)
            turn = parse(result.text, self.config.tool_parser, lenient=False) if use_tools else None
            calls = [{**c.openai(), "id": f"call_{record.request_id}_{i}"}
                     for i, c in enumerate(turn.tool_calls)] if turn is not None else []
            content = (turn.content.strip() or None) if turn is not None and calls else result.text
            if turn is not None:
                record.parse_errors = list(turn.errors)
                names = {t["function"]["name"] for t in tools or []}
                record.parse_errors += [f"call {c['function']['name']!r} names no tool of the "
                                        "request" for c in calls if c["function"]["name"] not in names]
                if req.tool_choice not in (None, "auto") and not calls:
                    record.parse_errors.append(f"tool_choice {record.tool_choice!r} not met: "
                                               "no tool call (generation is not constrained)")
            record.tool_calls = calls
            returned = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
            s.chat.record_model(result.token_ids, result.logprobs, result.token_versions, result.text,
                                wire.template_message(wire.MessageIn.model_validate(returned)))
        finish = "tool_calls" if calls and result.finish_reason == "stop" else result.finish_reason
        record.finish_reason = finish
        return self._answer(record, result, content, calls, finish, req.logprobs,
                            req.return_token_ids), record

    async def complete(self, s: Session, req: wire.CompletionRequest,
                       ignored: list[str]) -> tuple[Answer, RequestRecord]:
        received = self.clock.now()
        if s.chat is not None:
            exc = GatewayError("this session already serves /v1/chat/completions; one session "
                               "speaks one of the two", param="prompt")
            self.refuse(s, "completion", exc, received=received, model=req.model, stream=req.stream)
            raise exc
        sampling = self._sampling(req, req.max_tokens or self.config.default_max_tokens)
        async with self._locks[s.session_id]:
            if s.completion is None:
                s.completion = CompletionTranscript(self.tokenizer, self.eos_token_id)
            plan = s.completion.prompt(wire.prompt_of(req))
            record = self._record(s, "completion", req, sampling, ignored, received)
            result = await self._run(s, record, plan, sampling)
            s.completion.record_model(result.token_ids, result.logprobs, result.token_versions,
                                      result.text)
        record.finish_reason = result.finish_reason
        return self._answer(record, result, result.text, [], result.finish_reason,
                            req.logprobs is not None, req.return_token_ids), record

    def _answer(self, record: RequestRecord, result: GenerateResult, content: str | None,
                calls: list[dict[str, Any]], finish: str, logprobs: bool, ids: bool) -> Answer:
        texts = [self.tokenizer.decode([t]) for t in result.token_ids] if logprobs else None
        version = result.token_versions[-1] if result.token_versions else result.policy_version
        prefix = "chatcmpl" if record.kind == "chat" else "cmpl"
        return Answer(f"{prefix}-{record.request_id}", record.model or self.model, int(time.time()),
                      content, calls, finish, len(record.prompt_token_ids), len(result.token_ids),
                      version, texts, list(result.logprobs) if logprobs else None,
                      list(result.token_ids) if ids else None,
                      list(record.prompt_token_ids) if ids else None)

    async def _run(self, s: Session, record: RequestRecord, plan: PromptPlan,
                   sampling: SamplingParams) -> GenerateResult:
        """Route, take the slot, generate; fill ``record``; an engine failure is a GatewayError."""
        record.segment, record.prompt_token_ids = plan.segment, list(plan.prompt_ids)
        record.reused_prompt_tokens = plan.reused
        record.edit = plan.edit.to_dict() if plan.edit is not None else None
        record.new_segment_reason = plan.new_segment_reason
        s.requests.append(record)
        task = asyncio.create_task(self._generate(s, record, sampling))
        running = self._running.setdefault(s.session_id, set())
        running.add(task)
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            me = asyncio.current_task()
            if me is not None and me.cancelling():  # our caller went away: stop the engine too
                task.cancel()
                record.status, record.error = "cancelled", "the client went away"
                record.error_kind, record.http_status = "client_disconnect", 499
                raise
            record.status, record.error = "cancelled", "the session was closed"
            record.error_kind, record.http_status = "session_closed", 401
            raise GatewayError("the session was closed while this request ran", status=401,
                               kind="authentication_error") from None
        except GatewayError as exc:
            record.http_status = exc.status
            raise
        except Exception as exc:  # a defect of the gateway: recorded, then the 500
            record.status, record.error = "error", f"{type(exc).__name__}: {exc}"
            record.error_kind, record.http_status = "internal", 500
            raise
        finally:
            running.discard(task)
        t = record.timings
        t.total_s = self.clock.now() - t.received_at
        e = result.timings
        t.engine = {"total_s": e.total_s, "queue_s": e.queue_s, "prefill_s": e.prefill_s,
                    "decode_s": e.decode_s, "first_token_s": e.first_token_s}
        waited = t.slot_wait_s or 0.0
        t.queue_s = waited + (e.queue_s or 0.0)
        t.ttft_s = waited + e.first_token_s if e.first_token_s is not None else None
        record.output_token_ids, record.logprobs = list(result.token_ids), list(result.logprobs)
        record.token_versions, record.text = list(result.token_versions), result.text
        record.cached_prompt_tokens = result.cached_prompt_tokens
        record.finish_reason = result.finish_reason
        if result.finish_reason == "abort":
            record.status, record.error = "aborted", "the engine aborted the generation"
            record.error_kind, record.http_status = "engine_aborted", 503
            raise GatewayError("the engine aborted this generation (a weight update); send it "
                               "again", status=503, kind="server_error")
        return result

    async def _generate(self, s: Session, record: RequestRecord,
                        sampling: SamplingParams) -> GenerateResult:
        rid = record.request_id
        server = self.router.route(RouteRequest(rid, s.attempt_id, s.group_id, record.prompt_token_ids))
        record.server = server
        client = self.clients[server]
        finished = False
        try:
            t0 = self.clock.now()
            slot = s.slot(server) if s.slot is not None else contextlib.nullcontext()
            async with slot:
                record.timings.slot_wait_s = self.clock.now() - t0
                result = await client.generate(GenerateRequest(rid, record.prompt_token_ids, sampling))
            finished = result.finish_reason != "abort"
            return result
        except (BadRequestError, ServerOverloadedError) as exc:  # an answer, not a lost request
            finished = True
            record.status, record.error = "error", str(exc)
            if isinstance(exc, BadRequestError):
                too_long = "max_model_len" in str(exc)
                record.error_kind = "context_length" if too_long else "engine_refused"
                raise GatewayError(f"the engine refused the request: {exc}", param="messages",
                                   code="context_length_exceeded" if too_long else None) from exc
            record.error_kind = "engine_overloaded"
            raise GatewayError(f"the engine is overloaded: {exc}", status=503,
                               kind="server_error") from exc
        except InferenceError as exc:
            record.status, record.error = "error", str(exc)
            timeout = isinstance(exc, InferenceTimeoutError)
            record.error_kind = "engine_timeout" if timeout else "engine_error"
            raise GatewayError(f"inference failed: {exc}", status=504 if timeout else 502,
                               kind="server_error") from exc
        finally:
            (self.router.on_finish if finished else self.router.on_abort)(server, rid)
