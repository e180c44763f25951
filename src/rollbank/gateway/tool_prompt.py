"""Tools for a chat template that has no tools slot (SmolLM2's ChatML, Gemma's...).

:class:`ToolPromptTemplate` is the model's own :class:`~rollbank.chat.template.ChatTemplate`
with the request's tools described in the system message, Hermes style (``<tools>`` JSON
signatures, calls answered as ``<tool_call>{"name", "arguments"}</tool_call>``), assistant
tool calls written back as those blocks and tool results as ``<tool_response>`` blocks, so
the template renders them as text. Pure and deterministic like the template itself: a
session's prefix checks hold the same way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollbank.chat.template import ChatTemplate, Message

INSTRUCTIONS = (
    "# Tools\n\nYou can call functions to help with the request. Their signatures are in "
    "<tools></tools> tags:\n<tools>\n{tools}\n</tools>\n\nTo call one, answer with a JSON "
    "object of its name and arguments inside <tool_call></tool_call> tags:\n<tool_call>\n"
    '{{"name": <function-name>, "arguments": <arguments-object>}}\n</tool_call>'
)


def describe_tools(tools: Sequence[Mapping[str, Any]]) -> str:
    lines = [json.dumps(dict(t.get("function", t)), sort_keys=True) for t in tools]
    return INSTRUCTIONS.format(tools="\n".join(lines))


def _as_text(m: Message) -> dict[str, Any]:
    out = dict(m)
    content = m.get("content") or ""
    if m.get("role") == "assistant" and m.get("tool_calls"):
        blocks = []
        for c in m["tool_calls"]:
            f = c.get("function", {})
            blocks.append("<tool_call>\n" + json.dumps(
                {"name": f.get("name"), "arguments": f.get("arguments")}) + "\n</tool_call>")
        content = (content + "\n" if content else "") + "\n".join(blocks)
        out.pop("tool_calls")
    elif m.get("role") == "tool":
        content = f"<tool_response>\n{content}\n</tool_response>"
    out["content"] = content
    return out


@dataclass(frozen=True)
class ToolPromptTemplate(ChatTemplate):
    """The wrapped template renders tools as system-prompt text (see the module docstring)."""

    def render(self, messages: Sequence[Message], *, tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool) -> str:
        msgs = [_as_text(m) for m in messages]
        if tools:
            text = describe_tools(tools)
            if msgs and msgs[0].get("role") == "system":
                msgs[0] = {**msgs[0], "content": f"{msgs[0]['content']}\n\n{text}"}
            else:
                msgs.insert(0, {"role": "system", "content": text})
        return super().render(msgs, tools=None, add_generation_prompt=add_generation_prompt)

    @classmethod
    def wrapping(cls, template: ChatTemplate) -> ToolPromptTemplate:
        return cls(template.source, name=template.name, bos_token=template.bos_token,
                   eos_token=template.eos_token, use_transformers=template.use_transformers)
