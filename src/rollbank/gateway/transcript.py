"""Prefix reuse and edits: which token ids a session's next request is sent with.

Owns :class:`ChatTranscript` (chat requests, over :class:`rollbank.chat.session.ChatSession`)
and :class:`CompletionTranscript` (completion requests, token level). Pure: no I/O, no clock.

Chat: an agent resends its whole history each turn. When the history starts with exactly
the messages the session holds (what was sent before, plus each assistant message *as the
gateway returned it*) and the tools are unchanged, the held ids are reused exactly and only
the template's delta for the new messages is appended (``ChatSession.extend``). Otherwise
the agent edited its history and the edit is recorded (:class:`Edit`: truncated, edited,
retry, tools_changed) with a new segment: the full rendering of the new history. A template
that rewrites earlier turns makes ``extend`` start a new segment itself (reason
``template_rewrites_history``).

Completions: a prompt that extends the held ids (token ids), or the held text (prompt text +
the engine's text, when those ids stand for that text exactly), reuses the held ids; any
other prompt is a new segment.

Invariant (both): the ids a request is sent with are always the current segment's ids, and
every model token is conditioned on exactly the ids of its own segment before it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rollbank.chat.session import ChatSession, ChatTokenizer, Segment, TokenRecord
from rollbank.chat.template import ChatTemplate

EditReason = Literal["truncated", "edited", "retry", "tools_changed"]


@dataclass(frozen=True)
class Edit:
    """The agent's history differs from what the session held."""

    reason: EditReason
    at_message: int  # first sent message that differs from the held one
    held_messages: int
    sent_messages: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PromptPlan:
    """What one request is sent with."""

    prompt_ids: list[int]
    segment: int  # the index of the segment these ids belong to
    reused: int  # leading ids held from earlier requests, reused exactly
    edit: Edit | None = None
    new_segment_reason: str | None = None  # set when this request starts a segment


def _tools_key(tools: Sequence[dict[str, Any]] | None) -> str:
    return json.dumps(list(tools or []), sort_keys=True, default=str)


def classify_edit(held: Sequence[dict[str, Any]], sent: Sequence[dict[str, Any]], matched: int,
                  tools_same: bool) -> Edit:
    """Name how ``sent`` departs from ``held`` (``matched`` leading messages are equal)."""
    if not tools_same and matched == len(held):
        reason: EditReason = "tools_changed"
    elif matched == len(sent) and len(sent) < len(held):
        last_is_model = held[-1].get("role") == "assistant"
        reason = "retry" if last_is_model and len(sent) == len(held) - 1 else "truncated"
    else:
        reason = "edited"
    return Edit(reason, matched, len(held), len(sent))


class ChatTranscript:
    """One session's chat state (see the module docstring)."""

    def __init__(self, template: ChatTemplate, tokenizer: ChatTokenizer) -> None:
        self.session = ChatSession(template, tokenizer)
        self.edits: list[Edit] = []

    @property
    def segments(self) -> list[Segment]:
        return self.session.segments

    @property
    def record(self) -> TokenRecord:
        return self.session.record

    def prompt(self, messages: Sequence[dict[str, Any]],
               tools: Sequence[dict[str, Any]] | None) -> PromptPlan:
        s = self.session
        if not s.segments:
            ids = s.start(messages, tools)
            return PromptPlan(ids, 0, 0, new_segment_reason="start")
        held = list(s.messages)
        matched = s.match_prefix(messages)
        tools_same = _tools_key(tools) == _tools_key(s.tools)
        if tools_same and matched == len(held):
            before, segments = len(s), len(s.segments)
            s.extend(messages[matched:])
            if len(s.segments) != segments:  # the template rewrote held text: new segment
                return PromptPlan(s.prompt_token_ids, len(s.segments) - 1, 0,
                                  new_segment_reason=s.segments[-1].reason)
            return PromptPlan(s.prompt_token_ids, len(s.segments) - 1, before)
        edit = classify_edit(held, messages, matched, tools_same)
        self.edits.append(edit)
        s.restart(messages, edit.reason, tools=list(tools or []))
        return PromptPlan(s.prompt_token_ids, len(s.segments) - 1, 0, edit=edit,
                          new_segment_reason=edit.reason)

    def record_model(self, ids: Sequence[int], logprobs: Sequence[float],
                     versions: Sequence[int], text: str, message: dict[str, Any]) -> None:
        """The engine's sampled ids, exactly; ``message`` is the assistant message returned."""
        self.session.append_model(ids, logprobs, versions, text, message=message)


class CompletionTranscript:
    """One session's completion state (see the module docstring)."""

    def __init__(self, tokenizer: ChatTokenizer, eos_token_id: int | None) -> None:
        self.tokenizer = tokenizer
        self.eos = eos_token_id
        self.record = TokenRecord()
        self.segments: list[Segment] = []
        self._held: list[int] = []  # the current segment's ids
        self._held_text: str | None = None  # the text those ids stand for, when exact

    def prompt(self, prompt: str | list[int]) -> PromptPlan:
        if isinstance(prompt, list):
            if self.segments and prompt[:len(self._held)] == self._held:
                return self._extend(prompt[len(self._held):], None)
            return self._new_segment(list(prompt), None)
        if self.segments and self._held_text is not None and prompt.startswith(self._held_text):
            rest = prompt[len(self._held_text):]
            return self._extend(self.tokenizer.encode(rest) if rest else [], prompt)
        return self._new_segment(self.tokenizer.encode(prompt), prompt)

    def _extend(self, ids: list[int], text: str | None) -> PromptPlan:
        reused = len(self._held)
        self.record.append_prompt(list(ids))
        self._held += ids
        self._held_text = text
        return PromptPlan(list(self._held), len(self.segments) - 1, reused)

    def _new_segment(self, ids: list[int], text: str | None) -> PromptPlan:
        reason = "start" if not self.segments else "not_an_extension"
        start = len(self.record.token_ids)
        self.segments.append(Segment(len(self.segments), start, len(ids), reason, 0))
        self.record.append_prompt(list(ids))
        self._held = list(ids)
        self._held_text = text
        return PromptPlan(list(ids), len(self.segments) - 1, 0, new_segment_reason=reason)

    def record_model(self, ids: Sequence[int], logprobs: Sequence[float],
                     versions: Sequence[int], text: str) -> None:
        out = list(ids)
        self.record.append_model(out, list(logprobs), list(versions))
        self._held += out
        exact = (self._held_text is not None and not (out and out[-1] == self.eos)
                 and self.tokenizer.decode(out) == text)
        self._held_text = self._held_text + text if exact and self._held_text is not None else None
