'''Terminus-2 JSON protocol, for models strong enough to follow written instructions.

Each model turn is one JSON object::

    {"analysis": "...", "plan": "...",
     "commands": [{"keystrokes": "ls -la\\n", "duration": 0.1}, ...],
     "task_complete": false}

Parsing (never raises): the first JSON object in the text is used (a ```json fence or prose
around it is tolerated). ``commands`` must be a list of objects with a string ``keystrokes``
and an optional non-negative number ``duration`` (seconds the model wants to wait; the runner
may use it as the step timeout hint). ``task_complete: true`` ends the episode after the turn's
commands run. Anything else is MALFORMED with an observation that names the problem.

Differences from Harbor's Terminus-2, chosen deliberately and documented here:
- keystrokes are run as shell commands in a persistent shell (one trailing newline removed),
  not typed into tmux: tmux key names (``C-c``) are not interpreted;
- ``task_complete: true`` ends the episode at once (Terminus-2 asks for a confirmation turn).

Framing: ``plain`` writes a raw-text transcript (any base or instruct model); ``chatml`` and
``gemma`` wrap each prompt/observation in the model's chat turn markers, so the conversation
stays token-exact without re-rendering a chat template (the observation closes the model's
turn, opens a user turn with the output, and opens the next model turn).
'''

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollbank.episodes.config import Terminus2Config
from rollbank.episodes.harnesses.base import (
    Action,
    ActionKind,
    Command,
    render_result,
    sendable,
    skills_note,
    truncate_middle,
)
from rollbank.inference.protocol import SamplingParams
from rollbank.sandbox.protocol import ExecResult
from rollbank.tasks.model import Task


@dataclass(frozen=True)
class _Markers:
    user_start: str
    user_end: str
    model_start: str
    model_end: str
    stop: tuple[str, ...]


MARKERS: dict[str, _Markers] = {
    "plain": _Markers("", "\n\n", "Response (JSON):\n", "\n\n", ("\nNew terminal output:",)),
    "chatml": _Markers(
        "<|im_start|>user\n", "<|im_end|>\n", "<|im_start|>assistant\n", "<|im_end|>\n",
        ("<|im_end|>",),
    ),
    "gemma": _Markers(
        "<start_of_turn>user\n", "<end_of_turn>\n", "<start_of_turn>model\n",
        "<end_of_turn>\n", ("<end_of_turn>",),
    ),
}

INSTRUCTIONS = """You operate a Linux terminal to complete a task. Reply with exactly one JSON \
object and nothing else:
{
  "analysis": "what the latest output tells you and what is still missing",
  "plan": "what the commands below will do",
  "commands": [{"keystrokes": "ls -la\\n", "duration": 0.5}],
  "task_complete": false
}
- "commands": shell commands run in order in one persistent shell; end each with \\n.
  "duration" is how many seconds to wait for it (short for quick commands).
- Set "task_complete" to true only when the task is fully done; the episode then ends and is
  checked. Commands in the same reply still run first.

Task:
"""


_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)
#: At most this many ``{`` positions are tried as the start of the JSON object (over all
#: candidates): each failed decode costs O(position) (the error computes its line and
#: column), so an unbounded scan of a long turn full of ``{`` is quadratic.
MAX_OBJECT_STARTS = 64


_MAX_NUMBER = 1e300  # a duration above this (or an int float() cannot hold) is refused


class _ParseError(ValueError):
    pass


class Terminus2Harness:
    """The Terminus-2 JSON protocol (see the module docstring)."""

    name = "terminus-2"

    def __init__(self, config: Terminus2Config | None = None) -> None:
        self.config = config or Terminus2Config()
        self._m = MARKERS[self.config.framing]

    def initial_prompt(self, task: Task) -> str:
        m = self._m
        skills = skills_note(task)
        skills = f"\n{skills}" if skills else ""
        return (f"{m.user_start}{INSTRUCTIONS}{task.instruction.strip()}\n{skills}"
                f"{m.user_end}{m.model_start}")

    def step_prompt(self, task: Task) -> str:
        return self._user_turn("The previous task is done and was checked. Next task, in the "
                               f"same terminal:\n{task.instruction.strip()}")

    def parse(self, model_text: str) -> Action:
        try:
            obj = self._extract(model_text)
            commands, complete = self._validate(obj)
        except _ParseError as exc:
            return self._malformed(str(exc))
        return Action(ActionKind.DONE if complete else ActionKind.COMMANDS, commands)

    def format_observation(self, results: Sequence[ExecResult]) -> str:
        body = "\n".join(render_result(r) for r in results) if results else "[no command ran]"
        return self._user_turn("New terminal output:\n" + truncate_middle(
            body, self.config.observation_limit_bytes))

    def sampling(self) -> SamplingParams:
        c = self.config
        return SamplingParams(
            max_tokens=c.max_tokens, temperature=c.temperature, top_p=c.top_p, stop=self._m.stop
        )

    # ------------------------------------------------------------------ internals
    def _user_turn(self, content: str) -> str:
        m = self._m
        return f"{m.model_end}{m.user_start}{content.rstrip()}\n{m.user_end}{m.model_start}"

    def _malformed(self, error: str) -> Action:
        text = (
            f"Your previous reply could not be used: {error}\n"
            "Reply with exactly one JSON object as described at the start."
        )
        return Action(ActionKind.MALFORMED, error=error, observation=self._user_turn(text))

    @staticmethod
    def _extract(text: str) -> dict[str, Any]:
        candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
        decoder = json.JSONDecoder()
        last_error = "no JSON object found"
        tries = 0
        for cand in candidates:
            start = cand.find("{")
            while start != -1 and tries < MAX_OBJECT_STARTS:
                tries += 1
                try:
                    obj, _ = decoder.raw_decode(cand, start)
                except json.JSONDecodeError as exc:
                    last_error = f"invalid JSON ({exc.msg} at char {exc.pos})"
                except RecursionError:
                    last_error = "invalid JSON (nested too deeply)"
                else:
                    if isinstance(obj, dict):
                        return obj
                start = cand.find("{", start + 1)
        raise _ParseError(last_error)

    def _validate(self, obj: dict[str, Any]) -> tuple[tuple[Command, ...], bool]:
        complete = obj.get("task_complete", False)
        if not isinstance(complete, bool):
            raise _ParseError('"task_complete" must be true or false')
        raw = obj.get("commands")
        if raw is None:
            raise _ParseError('missing required field "commands" (a list, may be empty)')
        if not isinstance(raw, list):
            raise _ParseError('"commands" must be a list')
        commands: list[Command] = []
        for i, item in enumerate(raw):
            if not isinstance(item, dict) or not isinstance(item.get("keystrokes"), str):
                raise _ParseError(f'commands[{i}] needs a string "keystrokes"')
            duration = item.get("duration", 1.0)
            if isinstance(duration, bool) or not isinstance(duration, int | float) or not (
                    0 <= duration <= _MAX_NUMBER):  # False for NaN; bounds a huge int
                raise _ParseError(f'commands[{i}].duration must be a non-negative number')
            keys: str = item["keystrokes"]
            if not sendable(keys):
                raise _ParseError(f'commands[{i}].keystrokes holds a NUL or an unpaired surrogate')
            if keys.endswith("\n"):
                keys = keys[:-1]
            if keys.strip():
                commands.append(Command(keys, min(float(duration), self.config.max_duration_s)))
        if not commands and not complete:
            raise _ParseError('"commands" is empty and "task_complete" is false: nothing to do')
        return tuple(commands), complete
