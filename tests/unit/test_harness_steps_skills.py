"""Harness prompts for Harbor 1.1 tasks: the skills line of the first prompt, the next-step prompt."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rollbank.episodes.conversation import Conversation
from rollbank.episodes.harnesses import (
    FencedShellHarness,
    Harness,
    Terminus2Config,
    Terminus2Harness,
    skills_note,
)
from rollbank.episodes.trajectory import Trajectory
from rollbank.inference.fake import FakeTokenizer
from rollbank.tasks.loader import load_task
from rollbank.tasks.model import Task, TaskFormat

SKILLS_FIXTURE = Path(__file__).parents[1] / "fixtures" / "harbor-real" / "skills-magic-word"
HARNESSES: list[Harness] = [FencedShellHarness(), Terminus2Harness(),
                            Terminus2Harness(Terminus2Config(framing="gemma"))]


def plain_task() -> Task:
    return Task(task_id="t", path=Path("/tmp/t"), format=TaskFormat.HARBOR, content_hash="0" * 64,
                instruction="Fix the failing test.", dockerfile=None, context_dir=Path("/tmp/t"),
                tests_dir=Path("/tmp/t/tests"), test_command="bash /tests/test.sh", solution=None)


@pytest.mark.parametrize("harness", HARNESSES, ids=lambda h: getattr(h, "name", "?"))
def test_the_first_prompt_lists_the_skills_and_where_they_are(harness: Harness) -> None:
    task = load_task(SKILLS_FIXTURE)
    assert task.skills_dir == "/skills" and task.skills  # the loader's part
    prompt = harness.initial_prompt(task)
    assert "/skills" in prompt and "SKILL.md" in prompt
    assert "- house-style: How reports are signed in this house." in prompt
    assert "Skills" not in harness.initial_prompt(plain_task())


def test_fenced_shell_puts_the_skills_right_before_the_task_line() -> None:
    task = dataclasses.replace(plain_task(), skills_dir="/opt/skills",
                               skills=(("a", "does  A\nwell"), ("b", "")))
    prompt = FencedShellHarness().initial_prompt(task)
    assert prompt.endswith(skills_note(task) + "Task: Fix the failing test.\n")
    assert skills_note(task).splitlines()[1:] == ["- a: does A well", "- b"]


@pytest.mark.parametrize("harness", HARNESSES, ids=lambda h: getattr(h, "name", "?"))
def test_the_step_prompt_continues_the_conversation(harness: Harness) -> None:
    """After a finished step the next instruction is appended like an observation."""
    tok = FakeTokenizer()
    traj = Trajectory("e", "g", "t", 0)
    conv = Conversation(tok, traj)
    conv.start(harness.initial_prompt(plain_task()))
    before = tok.decode(list(traj.token_ids))
    nxt = dataclasses.replace(plain_task(), instruction="Now  add a README.")
    conv.append_observation(harness.step_prompt(nxt))
    text = tok.decode(list(traj.token_ids))
    assert text.startswith(before) and text.rstrip().endswith(
        harness.step_prompt(nxt).rstrip())
    assert "add a README." in harness.step_prompt(nxt)


def test_fenced_shell_step_prompt_is_a_new_task_line() -> None:
    nxt = dataclasses.replace(plain_task(), instruction="Now  add\na README.")
    assert FencedShellHarness().step_prompt(nxt) == "\nTask: Now add a README.\n"


def test_terminus2_step_prompt_closes_the_model_turn_and_opens_the_next() -> None:
    h = Terminus2Harness(Terminus2Config(framing="chatml"))
    p = h.step_prompt(dataclasses.replace(plain_task(), instruction="Second task."))
    assert p.startswith("<|im_end|>\n<|im_start|>user\n")
    assert p.endswith("Second task.\n<|im_end|>\n<|im_start|>assistant\n")
