"""The gateway's request shapes: OpenAI chat-completion and completion bodies, validated.

Owns :func:`parse_chat` and :func:`parse_completion`: raw body bytes in, a validated request
out, or a :class:`~rollbank.errors.GatewayError` (400) whose ``param`` names the field
(``messages[1].role``), never another exception. Pure: no I/O.

What is refused, and why (the gateway cannot honour it, so accepting it would be a lie):
``n`` > 1, ``best_of`` > 1, ``echo``, ``suffix``, ``logit_bias``, non-zero presence/frequency
penalties, ``top_logprobs`` > 0, a ``response_format`` other than text, image/audio content
parts. A refusal by one of the gateway's own limits (``max_tokens`` over the cap, too many
messages, nesting too deep) carries ``code`` :data:`OVER_LIMIT`. What is accepted and not forwarded: ``seed`` (the vLLM CPU engine dies on per-request
seeds; recorded), ``user``, ``metadata``, ``parallel_tool_calls``... (unknown keys are ignored
and listed in the request's record as ``ignored_fields``).
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rollbank.errors import GatewayError

Role = Literal["system", "developer", "user", "assistant", "tool"]
OVER_LIMIT = "over_limit"  # the error body's ``code`` when a gateway limit refused the request


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False, frozen=True)


class FunctionCallIn(_In):
    name: str = Field(min_length=1, max_length=256)
    arguments: str = ""


class ToolCallIn(_In):
    id: str = Field(default="", max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ContentPart(_In):
    type: Literal["text"]
    text: str


class MessageIn(_In):
    role: Role
    content: str | list[ContentPart] | None = None
    name: str | None = Field(default=None, max_length=256)
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = Field(default=None, max_length=256)


class FunctionSpec(_In):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(_In):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_In):
    name: str = Field(min_length=1)


class NamedToolChoice(_In):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(_In):
    include_usage: bool = False


class ResponseFormat(_In):
    type: Literal["text"]


class _Sampling(_In):
    model: str = Field(default="", max_length=512)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(default=0.0, ge=0.0, le=0.0, description="not supported: 0 only")
    frequency_penalty: float = Field(default=0.0, ge=0.0, le=0.0, description="not supported: 0 only")
    logit_bias: None = None
    return_token_ids: bool = Field(default=False, description="vLLM's extension: the choice "
                                   "carries token_ids and the response prompt_token_ids")

    def stops(self) -> tuple[str, ...]:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stop if s)


class ChatRequest(_Sampling):
    messages: list[MessageIn] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: Literal[0] | None = None
    response_format: ResponseFormat | None = None

    def completion_tokens(self, default: int) -> int:
        return self.max_completion_tokens or self.max_tokens or default


class CompletionRequest(_Sampling):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=0, description="0: the sampled "
                                 "token's log-prob per position (no alternatives)")
    echo: Literal[False] = False
    suffix: None = None
    best_of: Literal[1] | None = None


# ---------------------------------------------------------------------- decoding
M = TypeVar("M", bound=_In)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, d)
            stack.extend((v, d + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


def decode_body(body: bytes, *, max_depth: int) -> dict[str, Any]:
    """A request body as a JSON object (finite numbers, bounded nesting) or a 400."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GatewayError(f"the body is not UTF-8 (byte {exc.start})") from exc
    try:
        data = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError as exc:
        raise GatewayError(f"the body is nested more than {max_depth} levels deep",
                           code=OVER_LIMIT) from exc
    except ValueError as exc:  # JSONDecodeError, a refused constant, a huge integer
        raise GatewayError(f"the body is not valid JSON: {str(exc).split(';')[0]}") from exc
    if not isinstance(data, dict):
        raise GatewayError("the body must be a JSON object")
    if _depth(data) > max_depth:
        raise GatewayError(f"the body is nested more than {max_depth} levels deep", code=OVER_LIMIT)
    return data


_TYPE_LABELS = {"str", "int", "float", "bool", "none", "list", "dict"}  # pydantic's union labels


def _param(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part[:1].isupper() and "[" not in part and part not in _TYPE_LABELS:
            out += ("." if out else "") + part
    return out


def _validated(model: type[M], data: dict[str, Any]) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errs = exc.errors(include_url=False)
        # the error deepest in the body names the field best (unions report every member)
        first = max(errs, key=lambda e: len(e["loc"]))
        param = _param(tuple(first["loc"])) or None
        raise GatewayError(f"{param or 'body'}: {first['msg']}", param=param) from exc
    except (RecursionError, ValueError) as exc:  # defensive: pydantic on odd input
        raise GatewayError(f"invalid request: {exc}") from exc


def ignored_fields(model: type[BaseModel], data: dict[str, Any]) -> list[str]:
    """The body's top-level keys the gateway does not read (recorded, not an error)."""
    return sorted(k for k in data if k not in model.model_fields)[:32]


def parse_chat(body: bytes, *, max_depth: int = 64, max_messages: int = 2048,
               max_tokens_cap: int = 8192) -> tuple[ChatRequest, list[str]]:
    """A chat-completion body, validated; with the top-level keys it ignored."""
    data = decode_body(body, max_depth=max_depth)
    req = _validated(ChatRequest, data)
    if len(req.messages) > max_messages:
        raise GatewayError(f"{len(req.messages)} messages: at most {max_messages}", param="messages",
                           code=OVER_LIMIT)
    _check_common(req, max_tokens_cap)
    for k in ("max_tokens", "max_completion_tokens"):
        if (getattr(req, k) or 0) > max_tokens_cap:
            raise GatewayError(f"{k} above the gateway's cap {max_tokens_cap}", param=k,
                               code=OVER_LIMIT)
    if isinstance(req.tool_choice, NamedToolChoice):
        names = {t.function.name for t in req.tools or []}
        if req.tool_choice.function.name not in names:
            raise GatewayError(f"tool_choice names {req.tool_choice.function.name!r}, which is "
                               "not in tools", param="tool_choice.function.name")
    elif req.tool_choice == "required" and not req.tools:
        raise GatewayError("tool_choice 'required' needs tools", param="tool_choice")
    return req, ignored_fields(ChatRequest, data)


def parse_completion(body: bytes, *, max_depth: int = 64,
                     max_tokens_cap: int = 8192) -> tuple[CompletionRequest, list[str]]:
    """A completion body, validated (one prompt: text or token ids)."""
    data = decode_body(body, max_depth=max_depth)
    req = _validated(CompletionRequest, data)
    p = req.prompt
    if isinstance(p, list) and p and isinstance(p[0], str | list) and len(p) != 1:
        raise GatewayError("one prompt per request (n = 1)", param="prompt")
    if p == [] or p == "" or p == [[]] or p == [""]:
        raise GatewayError("the prompt is empty", param="prompt")
    _check_common(req, max_tokens_cap)
    if (req.max_tokens or 0) > max_tokens_cap:
        raise GatewayError(f"max_tokens above the gateway's cap {max_tokens_cap}", param="max_tokens",
                           code=OVER_LIMIT)
    return req, ignored_fields(CompletionRequest, data)


def _check_common(req: _Sampling, max_tokens_cap: int) -> None:
    stops = [req.stop] if isinstance(req.stop, str) else (req.stop or [])
    if len(stops) > 4:
        raise GatewayError("at most 4 stop sequences", param="stop")


def prompt_of(req: CompletionRequest) -> str | list[int]:
    """The single prompt: text, or token ids."""
    p = req.prompt
    if isinstance(p, str):
        return p
    if p and isinstance(p[0], str):
        return str(p[0])
    if p and isinstance(p[0], list):
        return [int(t) for t in p[0]]
    return [int(t) for t in p]  # type: ignore[arg-type]


def content_text(content: str | list[ContentPart] | None) -> str | None:
    if content is None or isinstance(content, str):
        return content
    return "".join(part.text for part in content)


def _arguments(raw: str) -> dict[str, Any] | str:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return raw
    return value if isinstance(value, dict) else raw


def template_message(m: MessageIn) -> dict[str, Any]:
    """A message as chat templates read it (``developer`` -> ``system``; text parts joined;
    tool-call arguments as objects, the way transformers' templates expect them)."""
    out: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role,
                           "content": content_text(m.content)}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function", "function": {
            "name": c.function.name, "arguments": _arguments(c.function.arguments)}}
            for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def tool_dicts(tools: list[ToolSpec] | None) -> list[dict[str, Any]] | None:
    return [t.model_dump(exclude_none=True) for t in tools] if tools else None
