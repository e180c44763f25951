"""What the gateway records: one :class:`RequestRecord` per request, one
:class:`SessionRecord` per attempt (handed back by ``Gateway.close_session``).

Invariants
- ``RequestRecord.prompt_token_ids`` are exactly the ids the engine was sent, and
  ``output_token_ids`` / ``logprobs`` / ``token_versions`` exactly what it returned (one each
  per output token). Every output token is conditioned on ``prompt_token_ids`` — the ids of
  segment ``segment`` up to that request — and on the output tokens before it.
- ``SessionRecord.tokens`` is the attempt's whole recorded sequence (segments one after the
  other: prompt ids mask 0, sampled ids mask 1 with their log-probs and versions, version -1
  on prompt ids); ``segments[i].start`` is where segment ``i`` begins in it.
- ``error_kind`` is None exactly when ``status`` is ``"ok"``: every failed or refused request
  says what failed (:data:`ErrorKind`). A request refused before generation (after its key
  selected the session) is in ``SessionRecord.refused``, never in ``requests``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["ok", "error", "aborted", "cancelled", "refused"]
Kind = Literal["chat", "completion"]
# What failed, for every request whose status is not "ok" (None on an answered request):
#   refused before generation (``status == "refused"``, in ``SessionRecord.refused``):
#     bad_request        the body, a field, the template or the session's mode refused it
#     over_limit         a gateway limit (max_tokens cap, messages, JSON depth) refused it
#   after routing (in ``SessionRecord.requests``):
#     context_length     the engine refused the prompt: it does not fit the context
#     engine_refused     the engine refused the request otherwise (a 4xx)
#     engine_overloaded  the engine answered it is overloaded
#     engine_timeout     no answer in the client's time
#     engine_error       transport failure, engine death, a malformed answer
#     engine_aborted     the engine aborted the generation (a weight update)
#     client_disconnect  the agent went away before the answer (the generation is cancelled)
#     session_closed     the session was closed while the request ran
#     internal           an unexpected failure inside the gateway
ErrorKind = Literal["bad_request", "over_limit", "context_length", "engine_refused",
                    "engine_overloaded", "engine_timeout", "engine_error", "engine_aborted",
                    "client_disconnect", "session_closed", "internal"]


@dataclass
class RequestTimings:
    """Seconds on the gateway's clock. ``queue_s``: from receipt until the engine started
    the request (waiting for the attempt's inference slot, the admission gate, and the
    engine's own queue when it reports it); ``ttft_s``: until the first token (the engine's
    report, plus the gateway's wait); ``total_s``: receipt to answer."""

    received_at: float
    queue_s: float | None = None
    ttft_s: float | None = None
    total_s: float | None = None
    slot_wait_s: float | None = None
    engine: dict[str, float | None] = field(default_factory=dict)


@dataclass
class RequestRecord:
    request_id: str
    kind: Kind
    model: str  # what the request asked for (the session's model serves it)
    stream: bool
    sampling: dict[str, Any]
    timings: RequestTimings
    status: Status = "ok"
    segment: int = -1
    prompt_token_ids: list[int] = field(default_factory=list)
    reused_prompt_tokens: int = 0  # leading prompt ids reused exactly from earlier requests
    cached_prompt_tokens: int | None = None  # the engine's prefix-cache hit, when it reports one
    output_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_versions: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    server: str | None = None
    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    parse_errors: list[str] = field(default_factory=list)
    tool_choice: Any = None
    edit: dict[str, Any] | None = None
    new_segment_reason: str | None = None
    ignored_fields: list[str] = field(default_factory=list)
    error: str | None = None
    error_kind: ErrorKind | None = None
    http_status: int | None = None  # the status the agent was answered with, when not 200

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SessionRecord:
    """Everything one attempt's agent did through the gateway."""

    session_id: str
    attempt_id: str
    group_id: str
    model: str
    opened_at: float
    closed_at: float
    requests: list[RequestRecord]
    segments: list[dict[str, Any]]
    tokens: dict[str, list[Any]]  # token_ids, logprobs, loss_mask, versions
    edits: list[dict[str, Any]]
    events: list[dict[str, Any]]
    rejected: int = 0  # requests refused before generation (bad body, wrong mode): len(refused)
    refused: list[RequestRecord] = field(default_factory=list)  # their records (status "refused")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["requests"] = [r.to_dict() for r in self.requests]
        out["refused"] = [r.to_dict() for r in self.refused]
        return out
