"""The chat harness: a chat model with tool calls, rendered by the model's own chat template.

Messages: a system message (how to work; the tool schemas go in the template's own tools
slot, or — for a template without one, such as SmolLM2's — into the system text with the
Hermes ``<tool_call>`` convention), few-shot example turns (a worked example task, its tool
calls written in the model's family format, so a 135M model has a fair chance), then the task
as the user message. Each model turn is parsed for tool calls
(:mod:`rollbank.chat.tool_parsers`, the family chosen per model: ``tool_format``); the first
call of a turn runs (``shell`` / ``read_file`` / ``write_file`` as shell commands in the
sandbox; ``submit`` ends the episode and the verifier runs) and its result comes back as a
``tool`` message, appended as the template's delta (:class:`~rollbank.chat.session.ChatSession`:
token-exact, model ids as sampled). A turn without a usable call is a malformed model turn:
a ``user`` message says what was wrong (a call with bad arguments gets the error as its
``tool`` result). Never raises on model output.

Lenient: a fenced ```bash block instead of a tool call is run as a shell call (when
``lenient``), and recorded as not well-formed. ``traj.meta["chat"]`` keeps, per turn, whether
the call was well-formed and the parser's errors, plus the template's segments and seam events.

Multi-step (Harbor 1.1) tasks are not supported by this harness yet (steps.py opens a text
conversation).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from rollbank.chat.session import ChatSession
from rollbank.chat.template import ChatTemplate, prefix_stable
from rollbank.chat.tool_parsers import ParsedTurn, ToolCall, parse
from rollbank.chat.tools import TOOLS, to_action
from rollbank.episodes.config import ChatConfig
from rollbank.episodes.conversation import Conversation
from rollbank.episodes.harnesses.base import (
    Action,
    ActionKind,
    Command,
    render_result,
    sendable,
    skills_note,
    truncate_middle,
)
from rollbank.episodes.trajectory import Trajectory
from rollbank.inference.protocol import GenerateResult, SamplingParams, Tokenizer
from rollbank.sandbox.protocol import ExecResult
from rollbank.tasks.model import Task

SYSTEM = """You solve tasks in a Linux sandbox by calling tools, one tool call per reply. \
Run commands with the shell tool, look at the results, and call submit when the task is done."""

TOOLS_IN_SYSTEM = """

You have these tools:
<tools>
{tools}
</tools>
To call a tool, reply with exactly:
<tool_call>
{{"name": "<tool name>", "arguments": {{<arguments as JSON>}}}}
</tool_call>"""

EXAMPLE_TASK = "Example task: create the file /tmp/example/hello.txt containing the word hi."
EXAMPLE_CALLS: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("shell", {"command": "mkdir -p /tmp/example && echo hi > /tmp/example/hello.txt"}, "[exit code 0]"),
    ("shell", {"command": "cat /tmp/example/hello.txt"}, "hi\n[exit code 0]"),
    ("submit", {}, ""),
)


def write_call(family: str, name: str, args: dict[str, Any]) -> str:
    """A tool call as the model writes it in ``family``."""
    if family == "llama3_json":
        return json.dumps({"name": name, "parameters": args})
    if family == "pythonic":
        return f"[{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})]"
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


class ChatHarness:
    """See the module docstring. One instance serves a whole collection (no episode state:
    that lives in each episode's :class:`ChatConversation`)."""

    name = "chat"

    def __init__(self, config: ChatConfig | None = None, *, template: ChatTemplate | None = None,
                 model: str | None = None) -> None:
        self.config = config or ChatConfig()
        self._template = template
        self._model = self.config.template or model

    @cached_property
    def template(self) -> ChatTemplate:
        if self._template is not None:
            return self._template
        if self._model is None:
            from rollbank.errors import ConfigError

            raise ConfigError("the chat harness needs a chat template: set chat.template "
                              "(a model name or folder)", field="chat.template")
        return ChatTemplate.for_model(self._model)

    @cached_property
    def family(self) -> str:
        if self.config.tool_format != "auto":
            return self.config.tool_format
        src = self.template.source
        return "llama3_json" if ("<|python_tag|>" in src or "ipython" in src) else "hermes"

    @cached_property
    def prefix_report(self) -> dict[str, Any]:
        return prefix_stable(self.template).to_dict()

    # ------------------------------------------------------------------ messages
    def messages(self, task: Task) -> list[dict[str, Any]]:
        system = SYSTEM
        if not self.template.supports_tools:  # no tools slot: the schemas in the system text
            system += TOOLS_IN_SYSTEM.format(tools="\n".join(json.dumps(t) for t in TOOLS))
        msgs: list[dict[str, Any]] = [{"role": "system", "content": system}]
        if self.config.few_shot:
            msgs.append({"role": "user", "content": EXAMPLE_TASK})
            for i, (name, args, result) in enumerate(EXAMPLE_CALLS):
                msgs.append({"role": "assistant", "content": write_call(self.family, name, args)})
                if name != "submit":
                    msgs.append({"role": "tool", "content": result, "tool_call_id": f"call_{i}"})
        skills = skills_note(task)
        text = task.instruction.strip() + (f"\n\n{skills}" if skills else "")
        msgs.append({"role": "user", "content": ("Now the real task. " if self.config.few_shot else "")
                     + text})
        return msgs

    def tools(self) -> list[dict[str, Any]] | None:
        return list(TOOLS) if self.template.supports_tools else None

    # ------------------------------------------------------------------ Harness protocol
    def initial_prompt(self, task: Task) -> str:
        return self.template.render(self.messages(task), tools=self.tools(), add_generation_prompt=True)

    def step_prompt(self, task: Task) -> str:
        return f"The previous task is done and was checked. Next task:\n{task.instruction.strip()}"

    def parse_turn(self, model_text: str) -> ParsedTurn:
        return parse(model_text, self.family, lenient=self.config.lenient)

    def parse(self, model_text: str) -> Action:
        turn = self.parse_turn(model_text)
        if not turn.tool_calls:
            why = "; ".join(turn.errors) or "no tool call in the reply"
            return self._malformed(why, "Your reply had no usable tool call: " + why
                                   + ". Reply with one tool call, for example:\n"
                                   + write_call(self.family, "shell", {"command": "ls"}))
        call = turn.tool_calls[0]
        act = to_action(call)
        if act.error is not None:
            return self._malformed(act.error, f"Error: {act.error}")
        if act.submit:
            return Action(ActionKind.DONE)
        assert act.command is not None
        if not sendable(act.command):
            return self._malformed("the command holds a NUL or an unpaired surrogate",
                                   "Error: the command holds a NUL or an unpaired surrogate")
        return Action(ActionKind.COMMANDS, (Command(act.command),))

    def format_observation(self, results: Sequence[ExecResult]) -> str:
        body = "\n".join(render_result(r) for r in results) if results else "[no command ran]"
        return truncate_middle(body, self.config.observation_limit_bytes)

    def sampling(self) -> SamplingParams:
        c = self.config
        return SamplingParams(max_tokens=c.max_tokens, temperature=c.temperature, top_p=c.top_p)

    def open_conversation(self, tokenizer: Tokenizer, traj: Trajectory, task: Task) -> ChatConversation:
        """The episode's token-exact chat, started with this task's messages."""
        conv = ChatConversation(self, tokenizer, traj)
        conv.start_chat(self.messages(task), self.tools())
        return conv

    @staticmethod
    def _malformed(error: str, text: str) -> Action:
        return Action(ActionKind.MALFORMED, error=error, observation=text)


class ChatConversation(Conversation):
    """A :class:`Conversation` whose ids come from a :class:`ChatSession`: the runner drives it
    as any conversation (prompt ids, model results, observation texts); observations become
    ``tool`` (a call's result) or ``user`` (a malformed turn) messages appended as deltas."""

    def __init__(self, harness: ChatHarness, tokenizer: Tokenizer, trajectory: Trajectory) -> None:
        super().__init__(tokenizer, trajectory, add_bos=False)
        self.harness = harness
        self.session = ChatSession(harness.template, tokenizer, sink=trajectory)
        self._last_call: ToolCall | None = None
        self._log: dict[str, Any] = {
            "template": harness.template.name, "tool_format": harness.family,
            "prefix_stable": harness.prefix_report["stable"],
            "tools_in": "template" if harness.template.supports_tools else "system",
            "turns": [], "segments": [], "events": self.session.events,
        }
        trajectory.meta["chat"] = self._log

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.session.prompt_token_ids

    def __len__(self) -> int:
        return len(self.session)

    def start(self, prompt_text: str) -> list[int]:
        raise RuntimeError("a chat conversation starts from messages: ChatHarness.open_conversation")

    def start_chat(self, messages: Sequence[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[int]:
        ids = self.session.start(messages, tools)
        self.trajectory.prompt_len = len(ids)
        self._started = True
        self._sync_segments()
        return ids

    def append_model(self, token_ids: Sequence[int], logprobs: Sequence[float],
                     policy_version: int | Sequence[int], text: str = "") -> None:
        self._require_started()
        self.session.append_model(token_ids, logprobs, policy_version, text)
        self._turns += 1
        turn = self.harness.parse_turn(text)
        self._last_call = turn.tool_calls[0] if turn.tool_calls else None
        self._log["turns"].append({"well_formed": turn.well_formed, "errors": turn.errors,
                                   "calls": [c.to_dict() for c in turn.tool_calls]})

    def append_result(self, result: GenerateResult) -> None:
        self.append_model(result.token_ids, result.logprobs, result.token_versions, result.text)

    def append_observation(self, text: str) -> list[int]:
        self._require_started()
        call, self._last_call = self._last_call, None
        if call is not None:
            msg = {"role": "tool", "content": text, "tool_call_id": call.id, "name": call.name}
        else:
            msg = {"role": "user", "content": text}
        ids = self.session.extend([msg])
        self._sync_segments()
        return ids

    def _sync_segments(self) -> None:
        self._log["segments"] = [s.to_dict() for s in self.session.segments]
        self.trajectory.segment_starts = [s.start for s in self.session.segments]
