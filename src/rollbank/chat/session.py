"""Token-exact chat state for one conversation, rendered by the model's own chat template.

Owns :class:`ChatSession`, :class:`Segment` and the small seams it records through
(:class:`ChatTokenizer`, :class:`TokenSink`, with :class:`TokenRecord` as the default sink).

How a conversation becomes token ids:

- ``start(messages, tools)``: the template's rendering with the generation prompt, tokenised
  once; segment 0 begins.
- ``append_model(ids, logprobs, versions, text)``: the engine's sampled ids, recorded exactly
  (never re-tokenised), mask 1, with their log-probs and per-token versions. ``text`` (the
  engine's text, stop token cut) becomes the held assistant message.
- ``extend(new_messages)``: the template's *delta* for the new messages only: with ``H`` the
  rendering of the held messages and ``F`` that of held + new with the generation prompt, the
  delta is ``F[len(H):]``, tokenised on its own. The seam: of the template's rendering of the
  model's own turn, only what the model did not sample is added (ChatML: the model sampled
  ``<|im_end|>`` as its stop token, so only the template's ``"\\n"`` after it is appended; a
  turn cut by ``max_tokens`` gets the whole ``<|im_end|>\\n``).
- A template that is not prefix-stable (``F`` does not start with ``H``: it rewrites earlier
  turns, e.g. drops past ``<think>`` reasoning) gets an explicit new :class:`Segment`: the full
  re-rendered prompt, tokenised and recorded after everything so far. Earlier ids are never
  re-tokenised in place; the trainer conditions each model token on its own segment only.
- ``restart(messages, tools, reason)``: the same new segment, asked for by the caller (an
  agent edited its history: truncation, summary).
- ``match_prefix(messages)``: how many leading messages of a resent history equal the held
  ones, so a gateway reuses the held ids of exactly those.

Invariants
- Every recorded id is either an engine-sampled id (mask 1) or part of a template rendering
  tokenised on its own (mask 0); ``prompt_token_ids`` is always the current segment's ids.
- ``extend`` never changes an id already recorded; the current segment only grows.
- ``events`` says what happened at each seam that was not a plain extension (new segments,
  a template that rewrote the model's own text), for the trajectory's metadata.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollbank.chat.template import ChatTemplate, Message

SENTINEL = "\x00ROLLBANK-SEAM\x00"


class ChatTokenizer(Protocol):
    """What the session needs of a tokenizer (any :class:`~rollbank.inference.protocol.Tokenizer`;
    one whose ``decode`` takes ``skip_special_tokens``, as ``HFTokenizer``, is asked to keep
    special tokens, so the seam sees the end-of-turn token the model sampled)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


def decode_with_specials(tokenizer: ChatTokenizer, ids: Sequence[int]) -> str:
    """``ids`` as text, special tokens included where the tokenizer can keep them."""
    decode: Any = tokenizer.decode
    try:
        return str(decode(list(ids), skip_special_tokens=False))
    except TypeError:  # a tokenizer without the flag (FakeTokenizer: no special tokens)
        return str(decode(list(ids)))


class TokenSink(Protocol):
    """Where ids are recorded (a :class:`~rollbank.episodes.trajectory.Trajectory` is one)."""

    def append_prompt(self, ids: list[int]) -> None: ...

    def append_model(self, ids: list[int], logprobs: list[float],
                     version: int | Sequence[int]) -> None: ...


@dataclass
class TokenRecord:
    """The default sink: the four per-token columns of a trajectory."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)

    def append_prompt(self, ids: list[int]) -> None:
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)
        self.versions += [-1] * len(ids)

    def append_model(self, ids: list[int], logprobs: list[float],
                     version: int | Sequence[int]) -> None:
        vs = [version] * len(ids) if isinstance(version, int) else list(version)
        if not len(ids) == len(logprobs) == len(vs):
            raise ValueError(f"{len(ids)} tokens, {len(logprobs)} logprobs, {len(vs)} versions")
        self.token_ids += ids
        self.logprobs += logprobs
        self.loss_mask += [1] * len(ids)
        self.versions += vs


@dataclass(frozen=True)
class Segment:
    """A stretch of the recorded sequence whose model tokens were conditioned only on the
    tokens from ``start`` on: ``prompt_len`` tokens of (re-)rendered prompt, then turns."""

    index: int
    start: int  # offset in the recorded sequence
    prompt_len: int
    reason: str  # "start" | "template_rewrites_history" | an edit named by the caller
    messages: int  # how many messages the prompt rendered

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


def same_message(a: Message, b: Message) -> bool:
    """Whether two messages render the same (the keys templates read)."""
    return all((a.get(k) or None) == (b.get(k) or None) for k in _KEYS)


class ChatSession:
    """One conversation's token-exact state (see the module docstring)."""

    def __init__(self, template: ChatTemplate, tokenizer: ChatTokenizer, *,
                 sink: TokenSink | None = None) -> None:
        self.template = template
        self.tokenizer = tokenizer
        self.record = TokenRecord()
        self._sinks: list[TokenSink] = [self.record] + ([sink] if sink is not None else [])
        self.messages: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] | None = None
        self.segments: list[Segment] = []
        self.events: list[dict[str, Any]] = []
        self._context: list[int] = []  # the current segment's ids
        self._prompt_text = ""  # the rendering the current prompt ends with
        self._model_text: str | None = None  # the last model turn, decoded with specials

    # ------------------------------------------------------------------ reading
    @property
    def prompt_token_ids(self) -> list[int]:
        """The next request's prompt: the current segment's ids (a copy)."""
        return list(self._context)

    def __len__(self) -> int:
        return len(self._context)

    @property
    def total_tokens(self) -> int:
        return len(self.record.token_ids)

    def match_prefix(self, messages: Sequence[Message]) -> int:
        """How many leading ``messages`` equal the held ones, in order."""
        n = 0
        for held, new in zip(self.messages, messages, strict=False):
            if not same_message(held, new):
                break
            n += 1
        return n

    # ------------------------------------------------------------------ writing
    def start(self, messages: Sequence[Message],
              tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """Render and tokenise the first prompt (generation prompt included): segment 0."""
        if self.segments:
            raise RuntimeError("session already started")
        self.tools = [dict(t) for t in tools] if tools else None
        return self._new_segment(messages, "start")

    def append_model(self, token_ids: Sequence[int], logprobs: Sequence[float],
                     versions: int | Sequence[int], text: str, *,
                     message: Mapping[str, Any] | None = None) -> None:
        """Record one model turn exactly as sampled; ``message`` (default: an assistant
        message with ``text`` as content) is what the session holds for the template."""
        self._require_started()
        ids = list(token_ids)
        for sink in self._sinks:
            sink.append_model(ids, list(logprobs), versions)
        self._context += ids
        self.messages.append(dict(message) if message is not None
                             else {"role": "assistant", "content": text})
        self._model_text = decode_with_specials(self.tokenizer, ids)

    def extend(self, new_messages: Sequence[Message]) -> list[int]:
        """Append the template's delta for ``new_messages`` (or a new segment if the template
        rewrites what is held); returns the ids appended."""
        self._require_started()
        new = [dict(m) for m in new_messages]
        full = self.template.render([*self.messages, *new], tools=self.tools,
                                    add_generation_prompt=True)
        delta = self._delta(new, full)
        if delta is None:
            self.events.append({"event": "segment", "reason": "template_rewrites_history",
                                "at_message": len(self.messages)})
            return self._new_segment([*self.messages, *new], "template_rewrites_history")
        self.messages += new
        self._prompt_text, self._model_text = full, None
        ids = self.tokenizer.encode(delta) if delta else []
        self._append_prompt(ids)
        return ids

    def restart(self, messages: Sequence[Message], reason: str,
                tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
        """A new segment on the caller's word (an edited history): the full rendering."""
        self._require_started()
        if tools is not None:
            self.tools = [dict(t) for t in tools] or None
        self.events.append({"event": "segment", "reason": reason, "at_message": len(self.messages)})
        return self._new_segment(messages, reason)

    # ------------------------------------------------------------------ internals
    def _require_started(self) -> None:
        if not self.segments:
            raise RuntimeError("call start() first")

    def _append_prompt(self, ids: list[int]) -> None:
        for sink in self._sinks:
            sink.append_prompt(list(ids))
        self._context += ids

    def _new_segment(self, messages: Sequence[Message], reason: str) -> list[int]:
        text = self.template.render(messages, tools=self.tools, add_generation_prompt=True)
        ids = self.tokenizer.encode(text)
        start = len(self.record.token_ids)
        self.segments.append(Segment(len(self.segments), start, len(ids), reason, len(messages)))
        self.messages = [dict(m) for m in messages]
        self._context = []
        self._prompt_text, self._model_text = text, None
        self._append_prompt(ids)
        return ids

    def _delta(self, new: list[dict[str, Any]], full: str) -> str | None:
        """The text to append for ``new``; None if the template rewrote held text."""
        if self._model_text is None:  # no model turn since the last prompt
            return full[len(self._prompt_text):] if full.startswith(self._prompt_text) else None
        held = self.template.render(self.messages, tools=self.tools, add_generation_prompt=False)
        if not (held.startswith(self._prompt_text) and full.startswith(held)):
            return None
        return self._closing(held[len(self._prompt_text):]) + full[len(held):]

    def _closing(self, turn: str) -> str:
        """Of the template's rendering ``turn`` of the model's last turn, what the model did
        not sample itself (its end-of-turn framing, less what it emitted)."""
        sampled = self._model_text or ""
        if turn.startswith(sampled):
            return turn[len(sampled):]
        # the template changed the model's text (trimmed it, ...): find its end framing
        # with a sentinel content, and add only what the sampled text does not end with
        probe = [*self.messages[:-1], {**self.messages[-1], "content": SENTINEL}]
        rendered = self.template.render(probe, tools=self.tools, add_generation_prompt=False)
        cut = rendered.rfind(SENTINEL)
        end = rendered[cut + len(SENTINEL):] if cut >= 0 else ""
        overlap = next((k for k in range(len(end), 0, -1) if sampled.endswith(end[:k])), 0)
        self.events.append({"event": "seam_rewritten", "sampled_tail": sampled[-80:],
                            "template_turn_tail": turn[-80:]})
        return end[overlap:]
