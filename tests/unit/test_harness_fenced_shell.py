"""Fenced-shell harness: prompt shape, parsing (incl. malformed output), observations."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbank.episodes.conversation import Conversation
from rollbank.episodes.harnesses import (
    ActionKind,
    FencedShellConfig,
    FencedShellHarness,
    make_harness,
    truncate_middle,
)
from rollbank.episodes.trajectory import Trajectory
from rollbank.inference.fake import FakeInferenceServer, FakeTokenizer
from rollbank.inference.protocol import GenerateRequest
from rollbank.sandbox.protocol import ExecResult
from rollbank.tasks.model import Task, TaskFormat


def task(instruction: str = "Write hello to out.txt.\n\nUse echo.") -> Task:
    return Task(
        task_id="hello", path=Path("/tmp/hello"), format=TaskFormat.HARBOR, content_hash="0" * 64,
        instruction=instruction, dockerfile=None, context_dir=Path("/tmp/hello"),
        tests_dir=Path("/tmp/hello/tests"), test_command="bash /tests/test.sh", solution=None,
    )


def ok(stdout: str = "", code: int | None = 0, **kw: object) -> ExecResult:
    return ExecResult(exit_code=code, signal=None, stdout=stdout, stderr="", duration_s=0.01, **kw)  # type: ignore[arg-type]


H = FencedShellHarness()


def test_prompt_is_few_shot_and_ends_with_the_task() -> None:
    p = H.initial_prompt(task())
    from rollbank.episodes.harnesses.fenced_shell import EXAMPLES

    assert p.count("Task: ") == len(EXAMPLES) + 1
    assert p.count("\nDONE\n") == len(EXAMPLES)
    assert p.endswith("Task: Write hello to out.txt. Use echo.\n")
    sp = H.sampling()
    assert "\nOutput:" in sp.stop and "\nTask:" in sp.stop
    assert make_harness("fenced-shell").name == "fenced-shell"
    with pytest.raises(ValueError):
        make_harness("nope")


def test_examples_follow_the_tasks_conventions() -> None:
    """Tasks name files by absolute path in backticks (`/app/x`); a 270M base model copies the
    examples' paths, so examples with relative paths taught it to write `x` or `app/x`."""
    import re

    from rollbank.episodes.harnesses.fenced_shell import EXAMPLES

    for instruction, steps in EXAMPLES:
        named = re.findall(r"`([^`]+)`", instruction)
        paths = [n for n in named if "/" in n]
        assert paths and all(n.startswith("/app/") for n in paths), instruction
        commands = " ".join(c for c, _ in steps)
        assert "`" not in commands
        assert all(p in commands for p in paths), (instruction, commands)
        assert not re.search(r"(?<![/\w.-])app/", commands)  # no relative app/ paths


@pytest.mark.parametrize(
    ("text", "kind", "commands"),
    [
        ("```bash\necho hello > out.txt\n```", ActionKind.COMMANDS, ["echo hello > out.txt"]),
        ("```sh\nls\n```\n```\npwd\n```", ActionKind.COMMANDS, ["ls", "pwd"]),
        ("DONE\n", ActionKind.DONE, []),
        ("  DONE.", ActionKind.DONE, []),
        ("```bash\ntouch a\n```\nDONE", ActionKind.DONE, ["touch a"]),
        ("DONE\n```bash\nrm -rf /\n```", ActionKind.DONE, []),
        ("```python\nprint(1)\n```\n```bash\nls\n```", ActionKind.COMMANDS, ["ls"]),
    ],
)
def test_parse_valid(text: str, kind: ActionKind, commands: list[str]) -> None:
    a = H.parse(text)
    assert a.kind is kind
    assert [c.text for c in a.commands] == commands
    assert a.observation is None


@pytest.mark.parametrize(
    ("text", "error_part"),
    [
        ("", "no ```bash block"),
        ("I think we should list files", "no ```bash block"),
        ("```bash\nls -la", "not closed"),
        ("```bash\n\n```", "empty"),
        ("\x00\xff garbage ``` ```", "no ```bash block"),
        ("I am DONE with this", "no ```bash block"),
    ],
)
def test_parse_malformed_never_raises_and_explains(text: str, error_part: str) -> None:
    a = H.parse(text)
    assert a.kind is ActionKind.MALFORMED
    assert a.error is not None and error_part in a.error
    assert a.observation is not None
    assert a.observation.startswith("\nOutput:\n```\n[rollbank: ")
    assert a.observation.endswith("```\n")


def test_observation_renders_status_and_truncates() -> None:
    obs = H.format_observation([ok("a\nb"), ok(code=2), ok(timed_out=True, code=None)])
    assert obs.startswith("\nOutput:\n```\na\nb\n[exit code 0]\n[exit code 2]\n[command timed out")
    assert obs.endswith("```\n")
    small = FencedShellHarness(FencedShellConfig(observation_limit_bytes=300))
    big = small.format_observation([ok("x" * 5000 + "END")])
    assert "bytes of output omitted by rollbank" in big
    assert "END" in big
    assert len(big.encode()) < 300 + 200


def test_truncate_middle_is_utf8_safe_and_bounded() -> None:
    text = "é" * 3000  # 6000 bytes
    out = truncate_middle(text, 1001)
    assert out.startswith("é") and out.endswith("é")
    assert "\ufffd" not in out
    head, _, tail = out.partition("\n[...")
    assert len(head.encode()) + len(tail.split("...]\n", 1)[1].encode()) <= 1001
    assert truncate_middle("short", 10) == "short"


async def test_turns_through_fake_server_and_conversation() -> None:
    """A scripted model: a command turn (stopped at Output:), then DONE."""
    replies = iter(["```bash\necho hi > out.txt\n```\nOutput:\n```\nmade up", "DONE\n\nTask: next"])
    tok = FakeTokenizer()
    server = FakeInferenceServer(tokenizer=tok, responder=lambda r: next(replies))
    conv = Conversation(tok, Trajectory("t", "g", "hello", 0))
    conv.start(H.initial_prompt(task()))
    sp = H.sampling()
    res = await server.generate(GenerateRequest("r0", conv.prompt_token_ids, sp))
    conv.append_result(res)
    a = H.parse(res.text)
    assert a.kind is ActionKind.COMMANDS and a.command_text == "echo hi > out.txt"
    conv.append_observation(H.format_observation([ok()]))
    res = await server.generate(GenerateRequest("r1", conv.prompt_token_ids, sp))
    conv.append_result(res)
    assert H.parse(res.text).kind is ActionKind.DONE
    transcript = tok.decode(conv.trajectory.token_ids)
    assert transcript.endswith(
        "Task: Write hello to out.txt. Use echo.\n```bash\necho hi > out.txt\n```\nOutput:\n"
        "```\n[exit code 0]\n```\nDONE\n\nTask:"
    )
