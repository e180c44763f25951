"""The harness seam: how an agent protocol turns model text into actions and results into text.

A :class:`Harness` is pure text processing: it writes the initial prompt for a task, parses a
model turn into an :class:`Action`, renders command results as the next observation, and says
how to sample. It never runs commands (the episode runner does) and never raises on model
output: anything it cannot use becomes ``ActionKind.MALFORMED`` with an ``observation`` that
tells the model what went wrong, so a malformed turn is still a recorded model turn.

Observations are bounded: :func:`truncate_middle` keeps the head and the tail of a long output
within ``limit_bytes`` of UTF-8 and says how much it dropped in the middle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from rollbank.episodes.config import DEFAULT_OBSERVATION_LIMIT
from rollbank.inference.protocol import SamplingParams
from rollbank.sandbox.protocol import ExecResult
from rollbank.tasks.model import Task

OBSERVATION_MARKER = "\n[... {dropped} bytes of output omitted by rollbank ...]\n"


class ActionKind(StrEnum):
    """What the model asked for this turn."""

    COMMANDS = "commands"  # run ``commands`` and show the results
    DONE = "done"  # run ``commands`` (possibly none), then end the episode and verify
    MALFORMED = "malformed"  # unusable output: append ``observation`` and continue


@dataclass(frozen=True)
class Command:
    """One shell command. ``duration_s`` is the model's requested wait (Terminus-2), if any."""

    text: str
    duration_s: float | None = None


@dataclass(frozen=True)
class Action:
    """A parsed model turn. ``observation`` is set only for MALFORMED (the error to show)."""

    kind: ActionKind
    commands: tuple[Command, ...] = ()
    error: str | None = None
    observation: str | None = None

    @property
    def done(self) -> bool:
        return self.kind is ActionKind.DONE

    @property
    def command_text(self) -> str | None:
        """All commands as one string (for StepRecord.action), None when there are none."""
        return "\n".join(c.text for c in self.commands) if self.commands else None


class Harness(Protocol):
    """An agent protocol (fenced shell for small base models, Terminus-2 JSON, ...)."""

    @property
    def name(self) -> str: ...

    def initial_prompt(self, task: Task) -> str:
        """The text of the first prompt for ``task`` (BOS is added by the conversation)."""
        ...

    def step_prompt(self, task: Task) -> str:
        """The text handing the model the next step of a multi-step task (``task`` is that
        step's view, ``Task.for_step``), appended after the previous step was verified."""
        ...

    def parse(self, model_text: str) -> Action:
        """Turn one model turn's text (stop string already cut) into an action. Never raises."""
        ...

    def format_observation(self, results: Sequence[ExecResult]) -> str:
        """Render the results of the last action's commands as the next observation text."""
        ...

    def sampling(self) -> SamplingParams:
        """How to sample a turn (max tokens, temperature, stop strings)."""
        ...


def sendable(text: str) -> bool:
    """A shell can receive ``text``: no NUL (bash drops it, argv refuses it) and valid UTF-8
    (a JSON ``\\udXXX`` escape can decode to a lone surrogate, which cannot be encoded)."""
    if "\0" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def skills_note(task: Task) -> str:
    """One line per skill the task ships (Harbor ``skills_dir``), or "" when it has none."""
    if not task.skills or not task.skills_dir:
        return ""
    lines = [f"Skills are available in {task.skills_dir} (each a folder with a SKILL.md to read):"]
    lines += [f"- {name}: {' '.join(desc.split())}" if desc else f"- {name}"
              for name, desc in task.skills]
    return "\n".join(lines) + "\n"


def truncate_middle(text: str, limit_bytes: int = DEFAULT_OBSERVATION_LIMIT) -> str:
    """Keep at most ``limit_bytes`` of UTF-8 (head and tail halves) plus a marker."""
    data = text.encode("utf-8")
    if len(data) <= limit_bytes:
        return text
    half = limit_bytes // 2
    head = data[:half].decode("utf-8", errors="ignore")
    tail = data[len(data) - (limit_bytes - half) :].decode("utf-8", errors="ignore")
    dropped = len(data) - len(head.encode("utf-8")) - len(tail.encode("utf-8"))
    return head + OBSERVATION_MARKER.format(dropped=dropped) + tail


def render_result(result: ExecResult) -> str:
    """A command's output as the model sees it: stdout, stderr, then a status line."""
    parts = [result.stdout]
    if result.stderr:
        if result.stdout and not result.stdout.endswith("\n"):
            parts.append("\n")
        parts.append(result.stderr)
    body = "".join(parts)
    if body and not body.endswith("\n"):
        body += "\n"
    if result.timed_out:
        status = f"[command timed out after {result.duration_s:.1f} s and was killed]"
    elif result.budget_exhausted:
        status = "[episode time budget exhausted]"
    elif result.oom_killed:
        status = "[killed: out of memory]"
    elif result.signal is not None:
        status = f"[killed by signal {result.signal}]"
    else:
        status = f"[exit code {result.exit_code}]"
    return body + status
