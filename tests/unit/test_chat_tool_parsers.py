"""Tool-call parsers: each family fuzzed (never raises), round trips, malformed turns."""

from __future__ import annotations

import json
import keyword
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollbank.chat.tool_parsers import FAMILIES, ParsedTurn, ToolCall, parse
from rollbank.chat.tools import TOOLS, to_action

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# identifiers a Python call can spell (pythonic calls are Python): no keyword (`if`, `in`, ...)
names = st.from_regex(r"[a-z_][a-z0-9_]{0,12}", fullmatch=True).filter(lambda n: not keyword.iskeyword(n))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=20))
args = st.dictionaries(st.from_regex(r"[a-z][a-z0-9_]{0,8}", fullmatch=True).filter(
    lambda n: not keyword.iskeyword(n)), scalars, max_size=4)
calls = st.lists(st.tuples(names, args), min_size=1, max_size=3)
# text that looks like tool calls, half-broken: the parsers' worst case
fragments = st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", "[", "]", "(", ")", '"name"',
                             ":", ",", "<|python_tag|>", "```bash\n", "```", "=", "'", '"', "\\",
                             '{"name": "shell", "arguments": ', "f(a=", "\n", ";", "**k", "1e999"])
noisy = st.lists(st.one_of(fragments, st.text(max_size=8)), max_size=40).map("".join)


def _shape(t: ParsedTurn) -> None:
    assert isinstance(t.content, str)
    for c in t.tool_calls:
        assert isinstance(c, ToolCall) and isinstance(c.name, str) and c.name
        assert isinstance(c.arguments, dict | str)
    assert all(isinstance(e, str) for e in t.errors)


@pytest.mark.parametrize("family", FAMILIES)
@FUZZ
@given(text=st.one_of(st.text(max_size=300), noisy))
def test_parsers_never_raise(family: str, text: str) -> None:
    turn = parse(text, family)
    _shape(turn)
    for c in turn.tool_calls:
        to_action(c)  # never raises either


def _render(family: str, cs: list[tuple[str, dict[str, Any]]]) -> str:
    if family == "hermes":
        return "Let me look.\n" + "\n".join(
            f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>" for n, a in cs)
    if family == "llama3_json":
        return "<|python_tag|>" + "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in cs)
    return "[" + ", ".join(f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in cs) + "]"


@pytest.mark.parametrize("family", FAMILIES)
@FUZZ
@given(cs=calls)
def test_well_formed_calls_round_trip(family: str, cs: list[tuple[str, dict[str, Any]]]) -> None:
    turn = parse(_render(family, cs), family)
    assert turn.errors == [] and turn.well_formed
    assert [(c.name, c.arguments) for c in turn.tool_calls] == cs
    assert [c.id for c in turn.tool_calls] == [f"call_{i}" for i in range(len(cs))]


def test_hermes_content_arguments_as_string_and_errors() -> None:
    t = parse('thinking <tool_call>{"name": "shell", "arguments": "{\\"command\\": \\"ls\\"}"}</tool_call>',
              "hermes")
    assert t.content == "thinking" and t.tool_calls[0].arguments == {"command": "ls"} and t.well_formed
    bad = parse('<tool_call>{"name": "shell", "arguments": {"command": "ls"}</tool_call>', "hermes")
    assert not bad.tool_calls and bad.errors[0].startswith("tool call 0: invalid JSON")
    cut = parse('<tool_call>{"name": "submit", "arguments": {}}', "hermes")  # ran out of tokens
    assert [c.name for c in cut.tool_calls] == ["submit"] and "no closing" in cut.errors[0]
    assert not cut.well_formed
    noname = parse('<tool_call>{"arguments": {}}</tool_call>', "hermes")
    assert noname.errors == ['tool call 0: missing string "name"']


def test_fenced_bash_is_accepted_leniently_and_recorded_as_not_well_formed() -> None:
    t = parse("I will list.\n```bash\nls -la /app\n```\n", "hermes")
    assert [(c.name, c.arguments) for c in t.tool_calls] == [("shell", {"command": "ls -la /app"})]
    assert not t.well_formed and "fenced shell block" in t.errors[-1]
    assert parse("```bash\nls\n```", "hermes", lenient=False).tool_calls == []
    assert parse("no tools at all", "pythonic").tool_calls == []


def test_pythonic_refuses_non_literals_and_positional_arguments() -> None:
    t = parse('[shell(command=open("x").read())]', "pythonic")
    assert not t.well_formed and "not a literal" in t.errors[0]
    p = parse('[shell("ls")]', "pythonic")
    assert "positional" in p.errors[0] and not p.tool_calls[0].well_formed
    prose = parse("see [1] and [2]", "pythonic")
    assert prose.tool_calls == [] and prose.errors == []


def test_llama3_json_without_python_tag_and_with_prose() -> None:
    t = parse('Sure: {"name": "read_file", "parameters": {"path": "/a"}}', "llama3_json")
    assert t.tool_calls[0].name == "read_file" and t.content == "Sure:"
    assert parse('{"a": 1}', "llama3_json").tool_calls == []


def test_unknown_family_is_an_error_not_an_exception() -> None:
    assert parse("x", "nope").errors == ["unknown tool-call family 'nope'"]


def test_tool_actions() -> None:
    assert to_action(ToolCall("c", "shell", {"command": "ls"})).command == "ls"
    assert to_action(ToolCall("c", "submit", {})).submit
    assert to_action(ToolCall("c", "read_file", {"path": "/a b"})).command == "cat -- '/a b'"
    w = to_action(ToolCall("c", "write_file", {"path": "/x", "content": "a'b\n"}))
    assert w.command is not None and "base64 -d > /x" in w.command
    assert "unknown tool" in (to_action(ToolCall("c", "rm", {})).error or "")
    assert to_action(ToolCall("c", "shell", "{bad")).error
    assert to_action(ToolCall("c", "shell", {"command": 3})).error
    assert {t["function"]["name"] for t in TOOLS} == {"shell", "read_file", "write_file", "submit"}
