'''Fenced-shell protocol: a few-shot prompt a small BASE model (no chat template) can follow.

The transcript format, taught by three worked examples in the prompt::

    Task: <instruction>
    ```bash
    <commands>
    ```
    Output:
    ```
    <stdout/stderr>
    [exit code N]
    ```
    DONE

The model writes one fenced ``bash`` block per step; generation stops at ``"\\nOutput:"`` (the
runner then supplies the real output) or at ``"\\nTask:"`` (the model started a new example).
A line ``DONE`` ends the episode. Parsing rules (never raise):
- every closed ```bash/```sh/``` block before the first ``DONE`` line is a command, in order;
- a ``DONE`` line with no block before it ends the episode with no commands; blocks followed by
  ``DONE`` in the same turn run first, then the episode ends;
- no block and no ``DONE``, an unclosed block, or an empty block is MALFORMED; the error is
  shown in the same ``Output:`` framing, so the transcript stays in format.
'''

from __future__ import annotations

import re
from collections.abc import Sequence

from rollbank.episodes.config import FencedShellConfig
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

DONE_MARKER = "DONE"
OUTPUT_STOP = "\nOutput:"
TASK_STOP = "\nTask:"

PREAMBLE = (
    "Below are transcripts of tasks solved in a Linux shell. Each step is one ```bash block; "
    "its real output follows under Output:. When the task is complete, the line DONE ends it.\n"
)

# The examples follow the conventions of the tasks the harness runs (Harbor / terminal-lite):
# the instruction names files by absolute path under /app, in `backticks`; the commands use
# those absolute paths without the backticks, act first and then check the result before DONE
# (an example that inspected first taught the model to inspect and never act).
EXAMPLES = (
    (
        "Task: Move `/app/inbox/todo.txt` into the directory `/app/archive` (create it if needed).",
        [
            ("mkdir -p /app/archive && mv /app/inbox/todo.txt /app/archive/", "[exit code 0]"),
            ("ls /app/archive", "todo.txt\n[exit code 0]"),
        ],
    ),
    (
        "Task: Write the number of words in `/app/notes.txt` (digits only) into `/app/words.txt`.",
        [
            ("wc -w < /app/notes.txt > /app/words.txt", "[exit code 0]"),
            ("cat /app/words.txt", "57\n[exit code 0]"),
        ],
    ),
    (
        "Task: Write the word `ok` (and nothing else) into `/app/status.txt`.",
        [
            ("echo ok > /app/status.txt", "[exit code 0]"),
            ("cat /app/status.txt", "ok\n[exit code 0]"),
        ],
    ),
    (
        "Task: Replace every occurrence of `foo` with `bar` in `/app/notes.txt`.",
        [
            ("sed -i 's/foo/bar/g' /app/notes.txt", "[exit code 0]"),
            ("grep -c foo /app/notes.txt", "0\n[exit code 1]"),
        ],
    ),
)

_BLOCK = re.compile(r"```(?P<lang>[A-Za-z]*)[ \t]*\n(?P<body>.*?)(?P<close>\n?```|\Z)", re.DOTALL)
_DONE_LINE = re.compile(r"^[ \t]*DONE[ \t.!]*$", re.MULTILINE)


def _transcript_step(command: str, output: str) -> str:
    return f"```bash\n{command}\n```\nOutput:\n```\n{output}\n```\n"


class FencedShellHarness:
    """The fenced-shell protocol (see the module docstring)."""

    name = "fenced-shell"

    def __init__(self, config: FencedShellConfig | None = None) -> None:
        self.config = config or FencedShellConfig()

    def initial_prompt(self, task: Task) -> str:
        parts = [PREAMBLE, "\n"]
        for instruction, steps in EXAMPLES:
            parts.append(instruction + "\n")
            parts.extend(_transcript_step(c, o) for c, o in steps)
            parts.append(DONE_MARKER + "\n\n")
        parts.append(skills_note(task))
        parts.append("Task: " + " ".join(task.instruction.split()) + "\n")
        return "".join(parts)

    def step_prompt(self, task: Task) -> str:
        # a new Task: line, as between the examples (the seam merge drops a "\nTask:" the
        # model was stopped on)
        return f"{TASK_STOP} " + " ".join(task.instruction.split()) + "\n"

    def parse(self, model_text: str) -> Action:
        done = _DONE_LINE.search(model_text)
        scope = model_text[: done.start()] if done else model_text
        commands: list[Command] = []
        for m in _BLOCK.finditer(scope):
            lang = m.group("lang").lower()
            if lang not in ("", "bash", "sh", "shell"):
                continue
            if not m.group("close"):
                return self._malformed("the ```bash block was not closed with ```")
            body = m.group("body").strip("\n")
            if not body.strip():
                return self._malformed("the ```bash block is empty")
            if not sendable(body):
                return self._malformed("the ```bash block holds a NUL or invalid text")
            commands.append(Command(body))
        if done:
            return Action(ActionKind.DONE, tuple(commands))
        if commands:
            return Action(ActionKind.COMMANDS, tuple(commands))
        return self._malformed(
            f"no ```bash block and no {DONE_MARKER} line found; write one ```bash block, "
            f"or {DONE_MARKER} when the task is complete"
        )

    def format_observation(self, results: Sequence[ExecResult]) -> str:
        body = "\n".join(render_result(r) for r in results) if results else "[no command ran]"
        body = truncate_middle(body, self.config.observation_limit_bytes)
        return self._framed(body)

    def sampling(self) -> SamplingParams:
        c = self.config
        return SamplingParams(
            max_tokens=c.max_tokens,
            temperature=c.temperature,
            top_p=c.top_p,
            stop=(OUTPUT_STOP, TASK_STOP),
        )

    def _framed(self, body: str) -> str:
        if not body.endswith("\n"):
            body += "\n"
        return f"{OUTPUT_STOP}\n```\n{body}```\n"

    def _malformed(self, error: str) -> Action:
        return Action(
            ActionKind.MALFORMED, error=error, observation=self._framed(f"[rollbank: {error}]")
        )
