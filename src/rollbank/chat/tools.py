"""The chat harness's tools as OpenAI function schemas, and a tool call as a shell action.

Tools: ``shell`` (a command in the sandbox's persistent shell), ``read_file``, ``write_file``
(both run as shell commands in the sandbox: ``cat``, and ``base64 -d`` of the content, so any
bytes survive quoting), ``submit`` (the task is done: the episode ends and is verified).

:func:`to_action` never raises: a call to an unknown tool or with wrong arguments comes back
with ``error`` set, the text shown to the model as that call's result.
"""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass
from typing import Any

from rollbank.chat.tool_parsers import ToolCall


def _fn(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


SHELL = _fn("shell", "Run a bash command in the task's Linux sandbox; returns its output and exit code.",
            {"command": {"type": "string", "description": "The bash command line to run."}},
            ["command"])
READ_FILE = _fn("read_file", "Read a text file in the sandbox.",
                {"path": {"type": "string", "description": "Path of the file."}}, ["path"])
WRITE_FILE = _fn("write_file", "Write (create or replace) a text file in the sandbox.",
                 {"path": {"type": "string", "description": "Path of the file."},
                  "content": {"type": "string", "description": "The whole new content."}},
                 ["path", "content"])
SUBMIT = _fn("submit", "Call when the task is complete; the work is then checked.", {}, [])

TOOLS: tuple[dict[str, Any], ...] = (SHELL, READ_FILE, WRITE_FILE, SUBMIT)
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)


@dataclass(frozen=True)
class ToolAction:
    """What a call asks for: a shell command, the end of the episode, or an error to show."""

    command: str | None = None
    submit: bool = False
    error: str | None = None


def _string(args: dict[str, Any], key: str) -> str | None:
    value = args.get(key)
    return value if isinstance(value, str) else None


def to_action(call: ToolCall) -> ToolAction:
    """The sandbox action for ``call`` (see the module docstring)."""
    args = call.arguments if isinstance(call.arguments, dict) else None
    if args is None:
        return ToolAction(error=f"{call.name}: arguments must be a JSON object")
    if call.name == "submit":
        return ToolAction(submit=True)
    if call.name == "shell":
        cmd = _string(args, "command")
        if cmd is None or not cmd.strip():
            return ToolAction(error='shell: needs a string argument "command"')
        return ToolAction(command=cmd)
    if call.name == "read_file":
        path = _string(args, "path")
        if not path:
            return ToolAction(error='read_file: needs a string argument "path"')
        return ToolAction(command=f"cat -- {shlex.quote(path)}")
    if call.name == "write_file":
        path, content = _string(args, "path"), _string(args, "content")
        if not path or content is None:
            return ToolAction(error='write_file: needs string arguments "path" and "content"')
        try:
            data = base64.b64encode(content.encode("utf-8")).decode("ascii")
        except UnicodeEncodeError:
            return ToolAction(error="write_file: content is not valid UTF-8")
        q = shlex.quote(path)
        return ToolAction(command=f"mkdir -p -- \"$(dirname -- {q})\" && "
                                  f"printf %s {data} | base64 -d > {q}")
    return ToolAction(error=f"unknown tool {call.name!r}; the tools are {', '.join(TOOL_NAMES)}")
