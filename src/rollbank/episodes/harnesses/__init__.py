"""Agent harnesses: the text protocols between a model and a shell.

- :class:`FencedShellHarness`: few-shot fenced ```bash blocks and a DONE marker, for small
  base models (Gemma 3 270M base).
- :class:`AnswerLineHarness`: the instruction is the prompt, the one completion the command
  (a model fitted to a one-line action format: the learning bench's warmed-up tiny model).
- :class:`Terminus2Harness`: Terminus-2 JSON turns, for models that follow instructions.
- ``chat.ChatHarness`` (imported from :mod:`rollbank.episodes.harnesses.chat`, not
  re-exported here, so loading a config stays light): a chat model with tool calls, rendered by its own chat template
  (token-exact through :class:`~rollbank.chat.session.ChatSession`; docs/chat.md).

See :mod:`rollbank.episodes.harnesses.base` for the :class:`Harness` protocol and the rules
every harness keeps (never raise on model output; bounded observations).
"""

from __future__ import annotations

from rollbank.episodes.config import (
    DEFAULT_OBSERVATION_LIMIT,
    AnswerLineConfig,
    ChatConfig,
    FencedShellConfig,
    Terminus2Config,
)
from rollbank.episodes.harnesses.answer_line import AnswerLineHarness
from rollbank.episodes.harnesses.base import (
    Action,
    ActionKind,
    Command,
    Harness,
    render_result,
    skills_note,
    truncate_middle,
)
from rollbank.episodes.harnesses.fenced_shell import FencedShellHarness
from rollbank.episodes.harnesses.terminus2 import Terminus2Harness

__all__ = [
    "DEFAULT_OBSERVATION_LIMIT",
    "Action",
    "ActionKind",
    "AnswerLineConfig",
    "AnswerLineHarness",
    "ChatConfig",
    "Command",
    "FencedShellConfig",
    "FencedShellHarness",
    "Harness",
    "Terminus2Config",
    "Terminus2Harness",
    "make_harness",
    "render_result",
    "skills_note",
    "truncate_middle",
]


def make_harness(name: str) -> Harness:
    """A harness with default config by name: ``fenced-shell`` or ``terminus-2``."""
    if name == FencedShellHarness.name:
        return FencedShellHarness()
    if name == AnswerLineHarness.name:
        return AnswerLineHarness()
    if name == Terminus2Harness.name:
        return Terminus2Harness()
    raise ValueError(f"unknown harness {name!r}; known: fenced-shell, terminus-2, answer-line")
