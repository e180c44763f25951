"""Terminus-2 JSON harness: parsing, malformed replies, framings, observations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollbank.episodes.harnesses import ActionKind, Terminus2Config, Terminus2Harness
from rollbank.sandbox.protocol import ExecResult
from rollbank.tasks.model import Task, TaskFormat


def task() -> Task:
    return Task(
        task_id="t", path=Path("/tmp/t"), format=TaskFormat.HARBOR, content_hash="0" * 64,
        instruction="Fix the failing test.", dockerfile=None, context_dir=Path("/tmp/t"),
        tests_dir=Path("/tmp/t/tests"), test_command="bash /tests/test.sh", solution=None,
    )


H = Terminus2Harness()


def reply(**kw: object) -> str:
    base: dict[str, object] = {"analysis": "a", "plan": "p", "commands": [], "task_complete": False}
    base.update(kw)
    return json.dumps(base)


def test_commands_and_durations() -> None:
    a = H.parse(reply(commands=[{"keystrokes": "ls -la\n", "duration": 0.1},
                                {"keystrokes": "cat x\n"}]))
    assert a.kind is ActionKind.COMMANDS
    assert [(c.text, c.duration_s) for c in a.commands] == [("ls -la", 0.1), ("cat x", 1.0)]


def test_task_complete_with_and_without_commands() -> None:
    a = H.parse(reply(commands=[{"keystrokes": "make\n", "duration": 500}], task_complete=True))
    assert a.kind is ActionKind.DONE
    assert a.commands[0].duration_s == 60.0  # capped by max_duration_s
    assert H.parse(reply(task_complete=True)).kind is ActionKind.DONE


def test_json_inside_fence_and_prose() -> None:
    text = "Sure! Here is my answer:\n```json\n" + reply(commands=[{"keystrokes": "pwd\n"}]) + "\n```"
    assert [c.text for c in H.parse(text).commands] == ["pwd"]
    text = "thinking {not json} then " + reply(commands=[{"keystrokes": "id\n"}]) + " trailing"
    assert [c.text for c in H.parse(text).commands] == ["id"]


@pytest.mark.parametrize(
    ("text", "error_part"),
    [
        ("", "no JSON object"),
        ("no braces at all", "no JSON object"),
        ('{"commands": [', "invalid JSON"),
        ('{"analysis": "x"}', 'missing required field "commands"'),
        (reply(commands="ls"), "must be a list"),
        (reply(commands=[{"keys": "ls"}]), 'needs a string "keystrokes"'),
        (reply(commands=[{"keystrokes": "ls", "duration": -1}]), "non-negative"),
        (reply(commands=[{"keystrokes": "ls", "duration": True}]), "non-negative"),
        (reply(task_complete="yes", commands=[{"keystrokes": "ls"}]), "task_complete"),
        (reply(), "nothing to do"),
        ("[1, 2, 3]", "no JSON object"),
    ],
)
def test_malformed_replies_become_error_observations(text: str, error_part: str) -> None:
    a = H.parse(text)
    assert a.kind is ActionKind.MALFORMED
    assert a.error is not None and error_part in a.error
    assert a.observation is not None and error_part in a.observation
    assert a.observation.endswith("Response (JSON):\n")


def test_chat_framings_wrap_turns() -> None:
    g = Terminus2Harness(Terminus2Config(framing="gemma"))
    p = g.initial_prompt(task())
    assert p.startswith("<start_of_turn>user\n") and p.endswith("<start_of_turn>model\n")
    assert "Fix the failing test." in p
    obs = g.format_observation([ExecResult(0, None, "ok\n", "", 0.1)])
    assert obs.startswith("<end_of_turn>\n<start_of_turn>user\nNew terminal output:\nok\n[exit code 0]")
    assert obs.endswith("<end_of_turn>\n<start_of_turn>model\n")
    assert g.sampling().stop == ("<end_of_turn>",)
    c = Terminus2Harness(Terminus2Config(framing="chatml"))
    assert c.initial_prompt(task()).endswith("<|im_start|>assistant\n")


def test_observation_truncated_to_limit() -> None:
    h = Terminus2Harness(Terminus2Config(observation_limit_bytes=1000))
    obs = h.format_observation([ExecResult(0, None, "y" * 50_000, "err", 1.0)])
    assert "bytes of output omitted by rollbank" in obs
    assert len(obs.encode()) < 1300
    assert "err" in obs
