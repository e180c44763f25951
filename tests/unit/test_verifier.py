"""Verifier classification and protocol (rollbank.episodes.verifier) against the fake backend."""

from __future__ import annotations

import base64
import io
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest

from rollbank.episodes.outcome import Outcome, Reason
from rollbank.episodes.verifier import (
    REWARD_JSON,
    REWARD_TXT,
    TOOLCHAIN_PINS,
    VerifierResult,
    VerifierStatus,
    classify,
    run_oracle,
    run_verifier,
    verifier_outcome,
)
from rollbank.episodes.verifier_pinned import _classify
from rollbank.sandbox.fake import FakeBackend, FakeSandbox
from rollbank.sandbox.protocol import ExecResult, SandboxSpec
from rollbank.tasks.loader import load_task
from rollbank.tasks.shims import SHIM_DIR

FIXTURES = Path(__file__).parents[1] / "fixtures" / "tasks"


def ran(exit_code: int | None = 0, *, timed_out: bool = False, signal: int | None = None) -> ExecResult:
    return ExecResult(exit_code, signal, "out", "err", 1.5, timed_out=timed_out)


@pytest.mark.parametrize(
    ("txt", "js", "status", "reward", "rewards"),
    [
        ("1\n", None, VerifierStatus.PASS, 1.0, {"reward": 1.0}),
        ("0", None, VerifierStatus.FAIL, 0.0, {"reward": 0.0}),
        ("0.5", None, VerifierStatus.FAIL, 0.5, {"reward": 0.5}),
        (None, '{"a": 1, "b": 1.0}', VerifierStatus.PASS, 1.0, {"a": 1.0, "b": 1.0}),
        (None, '{"a": 1, "b": 0}', VerifierStatus.FAIL, 0.5, {"a": 1.0, "b": 0.0}),
        (None, "1", VerifierStatus.PASS, 1.0, {"reward": 1.0}),
    ],
)
def test_rewards(txt: str | None, js: str | None, status: VerifierStatus, reward: float,
                 rewards: dict[str, float]) -> None:
    r = classify(ran(0), txt, js)
    assert (r.status, r.reward, r.rewards) == (status, reward, rewards)


def test_reward_txt_wins_over_json() -> None:
    assert classify(ran(0), "0", '{"a": 1}').status is VerifierStatus.FAIL


@pytest.mark.parametrize(
    ("result", "txt", "js", "status"),
    [
        (ran(None, timed_out=True), None, None, VerifierStatus.TIMEOUT),
        (ran(127), None, None, VerifierStatus.CRASH),  # e.g. missing interpreter
        (ran(None, signal=9), None, None, VerifierStatus.CRASH),
        (ran(0), None, None, VerifierStatus.NO_REWARD),
        (ran(0), "not a number", None, VerifierStatus.CRASH),
        (ran(0), "nan", None, VerifierStatus.CRASH),
        (ran(0), None, '{"a": "x"}', VerifierStatus.CRASH),
        (ran(0), None, "{}", VerifierStatus.CRASH),
        (ran(0), None, "{broken", VerifierStatus.CRASH),
    ],
)
def test_verifier_faults(result: ExecResult, txt: str | None, js: str | None,
                         status: VerifierStatus) -> None:
    r = classify(result, txt, js)
    assert r.status is status and r.reward is None


@pytest.mark.parametrize(
    ("status", "reason", "outcome"),
    [
        (VerifierStatus.PASS, Reason.VERIFIED_PASS, Outcome.MODEL_SUCCESS),
        (VerifierStatus.FAIL, Reason.VERIFIED_FAIL, Outcome.MODEL_FAILURE),
        (VerifierStatus.CRASH, Reason.VERIFIER_CRASH, Outcome.INFRA_FAILURE),
        (VerifierStatus.TIMEOUT, Reason.VERIFIER_TIMEOUT, Outcome.INFRA_FAILURE),
        (VerifierStatus.NO_REWARD, Reason.VERIFIER_NO_REWARD, Outcome.INFRA_FAILURE),
    ],
)
def test_outcome_mapping(status: VerifierStatus, reason: Reason, outcome: Outcome) -> None:
    reward = 1.0 if status is VerifierStatus.PASS else 0.0 if status is VerifierStatus.FAIL else None
    o = verifier_outcome(VerifierResult(status, reward, exit_code=3, duration_s=2.0, error="e"))
    assert (o.reason, o.outcome, o.reward) == (reason, outcome, reward)
    assert o.evidence["verifier_exit_code"] == 3 and o.evidence["verifier_error"] == "e"


# --------------------------------------------------------------- protocol, with the fake backend
def _backend(test_writes: bytes | None, rc: int = 0, *, reward_path: str = REWARD_TXT) -> FakeBackend:
    """A fake whose /bin/bash 'runs the tests' (writes ``test_writes``) and /bin/sh succeeds."""

    def sh(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
        return 0, b"", b""

    def bash(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
        script = args[-1]
        if "/solution/" in script:
            sb.files["/app/answer.txt"] = b"ready\n"
            return 0, b"", b""
        # the tests must be in place before the test command runs
        assert "/tests/test.sh" in sb.files and f"{SHIM_DIR}/uvx" in sb.files
        if test_writes is not None:
            sb.files[reward_path] = test_writes
        return rc, b"ran tests\n", b""

    return FakeBackend(handlers={"/bin/sh": sh, "/bin/bash": bash})


async def _start(backend: FakeBackend) -> FakeSandbox:
    sb = await backend.start(SandboxSpec(layers=(), workdir="/app"))
    assert isinstance(sb, FakeSandbox)
    return sb


async def test_tests_are_written_only_by_the_verifier_and_overwrite_agent_files() -> None:
    task = load_task(FIXTURES / "harbor-dockerfile-features")
    backend = _backend(b"1\n")
    sb = await _start(backend)
    sb.files["/tests/test.sh"] = b"echo 1 > /logs/verifier/reward.txt  # planted by the agent"
    result = await run_verifier(sb, task)
    assert result.status is VerifierStatus.PASS and result.reward == 1.0
    assert sb.files["/tests/test.sh"] == (task.tests_dir / "test.sh").read_bytes()
    assert sb.files["/tests/test_env.py"] == (task.tests_dir / "test_env.py").read_bytes()
    reset = sb.commands[0]
    run = next(c for c in sb.commands if c.startswith("/bin/bash"))
    assert "rm -rf /tests" in reset and "/logs/verifier" in reset
    assert "bash /tests/test.sh" in run and SHIM_DIR in run


async def test_reward_json_is_read_when_there_is_no_reward_txt() -> None:
    task = load_task(FIXTURES / "harbor-dockerfile-features")
    sb = await _start(_backend(b'{"x": 1, "y": 0.5}', reward_path=REWARD_JSON))
    result = await run_verifier(sb, task)
    assert result.status is VerifierStatus.FAIL and result.reward == 0.75


async def test_missing_reward_with_exit_zero_is_no_reward() -> None:
    task = load_task(FIXTURES / "harbor-dockerfile-features")
    result = await run_verifier(await _start(_backend(None, 0)), task)
    assert result.status is VerifierStatus.NO_REWARD
    assert verifier_outcome(result).outcome is Outcome.INFRA_FAILURE


async def test_missing_reward_with_failure_is_a_crash() -> None:
    task = load_task(FIXTURES / "harbor-dockerfile-features")
    result = await run_verifier(await _start(_backend(None, 126)), task)
    assert result.status is VerifierStatus.CRASH and result.exit_code == 126


async def test_stale_reward_from_the_agent_is_removed_before_the_tests() -> None:
    task = load_task(FIXTURES / "harbor-dockerfile-features")

    def sh(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
        sb.files.pop(REWARD_TXT, None)  # what the reset command does for real
        return 0, b"", b""

    def bash(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
        return 0, b"", b""  # the tests write nothing

    sb = await _start(FakeBackend(handlers={"/bin/sh": sh, "/bin/bash": bash}))
    sb.files[REWARD_TXT] = b"1\n"  # planted by the agent
    result = await run_verifier(sb, task)
    assert result.status is VerifierStatus.NO_REWARD


async def test_oracle_uploads_the_solution_folder_and_runs_it() -> None:
    task = load_task(FIXTURES / "harbor-dockerfile-features")
    sb = await _start(_backend(b"1"))
    res = await run_oracle(sb, task)
    assert res is not None and res.exit_code == 0
    assert sb.files["/solution/solve.sh"] == (task.path / "solution" / "solve.sh").read_bytes()
    assert sb.files["/app/answer.txt"] == b"ready\n"


class _PinnedFake(FakeSandbox):
    """A fake that can pin: records the pinned commands and answers them from a script
    (the fake's interpreter has no tar/base64; the real view is tested in integration)."""

    def __init__(self, inner: FakeSandbox) -> None:
        super().__init__(inner.backend, inner.sandbox_id, inner.spec, inner.files, None)
        self.pinned: list[tuple[list[str], tuple[str, ...], dict[str, str], bytes | None]] = []
        self.killed = False

    @property
    def can_pin(self) -> bool:
        return True

    async def kill_leftovers(self) -> None:
        self.killed = True

    async def exec_pinned(self, command: str | Sequence[str], *, pins: Sequence[str],
                          timeout_s: float | None = None, cwd: str | None = None,
                          env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                          output_limit: int = 0) -> ExecResult:
        argv = [command] if isinstance(command, str) else list(command)
        self.pinned.append((argv, tuple(pins), dict(env or {}), stdin))
        files = [b"tests ran\n", b"", None, b"1\n", None]  # stdout, stderr, shim error, txt, json
        lines = ["@@rb rc 0"] + [f"F {base64.b64encode(f).decode()}" if f is not None else "N"
                                 for f in files]
        return ExecResult(0, None, "\n".join(lines) + "\n", "", 0.01)


async def test_a_pinnable_sandbox_verifies_in_one_pinned_command() -> None:
    """Staging, test command and reward read run as ONE command on the pristine toolchain,
    with /tests, /logs/verifier and the shims private to it; nothing runs unpinned, and the
    agent's processes are not killed (as under Harbor: they cannot reach the pinned view)."""
    task = load_task(FIXTURES / "harbor-dockerfile-features")
    sb = _PinnedFake(await _start(_backend(b"1\n")))
    result = await run_verifier(sb, task, kill_leftovers=True)
    assert result.status is VerifierStatus.PASS and result.pinned and not sb.killed
    assert result.stdout_tail == "tests ran\n"
    assert verifier_outcome(result).evidence["verifier_pinned"] is True
    assert sb.commands == []  # no unpinned command at all
    ((argv, pins, env, payload),) = sb.pinned
    assert pins[:len(TOOLCHAIN_PINS)] == TOOLCHAIN_PINS
    assert {"+/tests", "+/logs/verifier", f"+{SHIM_DIR}"} <= set(pins)
    assert "kill -9" not in argv[2] and "tar -x --no-same-owner -C /" in argv[2]
    assert env["ROLLBANK_TEST_COMMAND"] == task.test_command and env["PYTHONNOUSERSITE"] == "1"
    assert payload is not None
    with tarfile.open(fileobj=io.BytesIO(payload)) as tar:
        names = tar.getnames()
        data = tar.extractfile("tests/test.sh")
        assert data is not None and data.read() == (task.tests_dir / "test.sh").read_bytes()
    assert f"{SHIM_DIR.lstrip('/')}/uvx" in names


@pytest.mark.parametrize(("stdout", "status", "exit_code", "signal"), [
    ("@@rb rc 137\nN\nN\nN\nN\nN\n", VerifierStatus.CRASH, None, 9),  # killed, no reward
    ("@@rb rc 0\nN\nN\nN\nN\nN\n", VerifierStatus.NO_REWARD, 0, None),
    ("@@rb prepare-failed\n", VerifierStatus.CRASH, 0, None),
    ("", VerifierStatus.CRASH, 0, None),  # e.g. the toolchain path was wrecked (exit 126)
])
def test_pinned_output_is_classified_like_the_unpinned_verifier(
        stdout: str, status: VerifierStatus, exit_code: int | None, signal: int | None) -> None:
    res = _classify(ExecResult(0, None, stdout, "", 1.0))
    assert res.status is status and res.exit_code == exit_code and res.signal == signal


async def test_a_sandbox_that_cannot_pin_is_verified_as_before_and_says_so() -> None:
    task = load_task(FIXTURES / "harbor-dockerfile-features")
    sb = await _start(_backend(b"1\n"))
    result = await run_verifier(sb, task)
    assert result.status is VerifierStatus.PASS and not result.pinned
    assert verifier_outcome(result).evidence["verifier_pinned"] is False
