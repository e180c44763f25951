"""Answer-line protocol: the prompt is the task's instruction, the completion is one command.

For a model fitted to a one-line action format (the learning bench's warmed-up tiny model,
``Q: 13+7=? A: echo 20 > answer.txt``): the initial prompt is the instruction text as it is
(whitespace runs collapsed, no preamble, no examples), the model writes one completion, and
that completion (stripped) is the episode's only command; the episode then ends and the task's
verifier runs. One turn per episode, always:
- a non-empty completion -> ``DONE`` with that command (the sandbox runs it, whatever it is);
- an empty completion -> ``DONE`` with no command (the verifier judges the untouched sandbox);
- a completion holding a NUL or invalid text -> ``DONE`` with no command.
Sampling stops at the end-of-sequence token or at a newline (``stop = "\\n"``).
"""

from __future__ import annotations

from collections.abc import Sequence

from rollbank.episodes.config import DEFAULT_OBSERVATION_LIMIT, AnswerLineConfig
from rollbank.episodes.harnesses.base import (
    Action,
    ActionKind,
    Command,
    render_result,
    sendable,
    truncate_middle,
)
from rollbank.inference.protocol import SamplingParams
from rollbank.sandbox.protocol import ExecResult
from rollbank.tasks.model import Task

LINE_STOP = "\n"


class AnswerLineHarness:
    """The answer-line protocol (see the module docstring)."""

    name = "answer-line"

    def __init__(self, config: AnswerLineConfig | None = None) -> None:
        self.config = config or AnswerLineConfig()

    def initial_prompt(self, task: Task) -> str:
        return " ".join(task.instruction.split())

    def step_prompt(self, task: Task) -> str:
        return "\n" + " ".join(task.instruction.split())

    def parse(self, model_text: str) -> Action:
        command = model_text.strip()
        if not command or not sendable(command):
            return Action(ActionKind.DONE)
        return Action(ActionKind.DONE, (Command(command),))

    def format_observation(self, results: Sequence[ExecResult]) -> str:
        body = "\n".join(render_result(r) for r in results) if results else "[no command ran]"
        return "\n" + truncate_middle(body, DEFAULT_OBSERVATION_LIMIT) + "\n"

    def sampling(self) -> SamplingParams:
        c = self.config
        return SamplingParams(max_tokens=c.max_tokens, temperature=c.temperature, top_p=c.top_p,
                              stop=(LINE_STOP,))

