"""OpenAI response bodies: chat completions (whole and as stream chunks), completions, the
model list and the error body. Pure builders of JSON-ready dicts.

Extensions beside OpenAI's fields (clients ignore unknown keys): with ``return_token_ids``
(vLLM's name for it) the choice carries ``token_ids`` and the response ``prompt_token_ids``;
``system_fingerprint`` is ``rollbank-v<version>``, the weight version of the last token.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rollbank.errors import GatewayError


def error_body(exc: GatewayError) -> dict[str, Any]:
    return {"error": {"message": str(exc), "type": exc.kind, "param": exc.param, "code": exc.code}}


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


@dataclass(frozen=True)
class Answer:
    """One finished generation, as the routes present it."""

    response_id: str
    model: str
    created: int
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    version: int
    token_texts: list[str] | None = None  # per output token (logprobs requested)
    logprobs: list[float] | None = None
    token_ids: list[int] | None = None  # return_token_ids
    prompt_token_ids: list[int] | None = None

    @property
    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    @property
    def fingerprint(self) -> str:
        return f"rollbank-v{self.version}"


def _chat_logprobs(a: Answer) -> dict[str, Any] | None:
    if a.logprobs is None or a.token_texts is None:
        return None
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")),
                         "top_logprobs": []} for t, lp in zip(a.token_texts, a.logprobs, strict=True)],
            "refusal": None}


def _ids(a: Answer, target: dict[str, Any], choice: dict[str, Any]) -> None:
    if a.token_ids is not None:
        choice["token_ids"] = a.token_ids
        target["prompt_token_ids"] = a.prompt_token_ids


def chat_response(a: Answer) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": a.content}
    if a.tool_calls:
        message["tool_calls"] = a.tool_calls
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": a.finish_reason,
                              "logprobs": _chat_logprobs(a)}
    out: dict[str, Any] = {"id": a.response_id, "object": "chat.completion", "created": a.created,
                           "model": a.model, "system_fingerprint": a.fingerprint,
                           "choices": [choice], "usage": a.usage}
    _ids(a, out, choice)
    return out


def chat_chunk(a_id: str, model: str, created: int, delta: dict[str, Any],
               finish_reason: str | None = None, **extra: Any) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason,
                              "logprobs": extra.pop("logprobs", None)}
    choice.update(extra.pop("choice_extra", {}))
    return {"id": a_id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [choice], **extra}


def chat_stream_tail(a: Answer, *, include_usage: bool) -> list[dict[str, Any]]:
    """The chunks after the role chunk: content (with its log-probs), one per tool call,
    the finish chunk, and the usage chunk when asked for."""
    chunks: list[dict[str, Any]] = []
    if a.content:
        choice_extra = {"token_ids": a.token_ids} if a.token_ids is not None else {}
        chunks.append(chat_chunk(a.response_id, a.model, a.created, {"content": a.content},
                                 logprobs=_chat_logprobs(a), choice_extra=choice_extra,
                                 system_fingerprint=a.fingerprint))
    for i, call in enumerate(a.tool_calls):
        chunks.append(chat_chunk(a.response_id, a.model, a.created, {"tool_calls": [{
            "index": i, "id": call["id"], "type": "function", "function": call["function"]}]},
            system_fingerprint=a.fingerprint))
    chunks.append(chat_chunk(a.response_id, a.model, a.created, {}, a.finish_reason,
                             system_fingerprint=a.fingerprint))
    if include_usage:
        last = chat_chunk(a.response_id, a.model, a.created, {}, None, usage=a.usage)
        last["choices"] = []
        chunks.append(last)
    return chunks


def _completion_logprobs(a: Answer) -> dict[str, Any] | None:
    if a.logprobs is None or a.token_texts is None:
        return None
    offsets, pos = [], 0
    for t in a.token_texts:
        offsets.append(pos)
        pos += len(t)
    return {"tokens": a.token_texts, "token_logprobs": a.logprobs,
            "top_logprobs": None, "text_offset": offsets}


def completion_response(a: Answer, text: str) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": a.finish_reason,
                              "logprobs": _completion_logprobs(a)}
    out: dict[str, Any] = {"id": a.response_id, "object": "text_completion", "created": a.created,
                           "model": a.model, "system_fingerprint": a.fingerprint,
                           "choices": [choice], "usage": a.usage}
    _ids(a, out, choice)
    return out


def completion_chunks(a: Answer, text: str, *, include_usage: bool) -> list[dict[str, Any]]:
    body = completion_response(a, text)
    body.pop("usage")
    chunks = [body]
    if include_usage:
        chunks.append({"id": a.response_id, "object": "text_completion", "created": a.created,
                       "model": a.model, "choices": [], "usage": a.usage})
    return chunks


def models_body(names: list[str], created: int) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": n, "object": "model", "created": created,
                                        "owned_by": "rollbank"} for n in names]}
