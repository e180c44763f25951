"""FakeBackend: the in-memory sandbox used by episode-runner unit tests keeps the protocol."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbank.clock import FakeClock
from rollbank.errors import SandboxError, SandboxStartError
from rollbank.sandbox.fake import FakeBackend, FakeSandbox
from rollbank.sandbox.protocol import TRUNCATION_MARKER, SandboxSpec

SPEC = SandboxSpec(layers=(Path("/nonexistent-base"),), workdir="/app", env={"GREETING": "hi"})


async def _sb(clock: FakeClock | None = None, **kw: object) -> tuple[FakeBackend, FakeSandbox]:
    backend = FakeBackend(clock, **kw)  # type: ignore[arg-type]
    return backend, await backend.start(SPEC)


async def test_echo_redirect_cat_and_lists() -> None:
    _, sb = await _sb()
    r = await sb.exec("echo $GREETING world > out.txt && cat /app/out.txt; false || echo rescued")
    assert r.ok and r.stdout == "hi world\nrescued\n"
    assert sb.files["/app/out.txt"] == b"hi world\n"
    r = await sb.exec("printf '%s-%d\\n' a 7 >> out.txt; cat out.txt")
    assert r.stdout == "hi world\na-7\n"


async def test_exit_codes_unknown_command_and_ls() -> None:
    _, sb = await _sb()
    assert (await sb.exec("exit 3")).exit_code == 3
    assert (await sb.exec("true && exit 4; echo never")).exit_code == 4
    r = await sb.exec("nosuchtool --x")
    assert r.exit_code == 127 and "nosuchtool: not found" in r.stderr
    await sb.write_file("/app/d/a.txt", b"1")
    await sb.write_file("/app/d/sub/b.txt", b"2")
    assert (await sb.exec("ls d")).stdout == "a.txt\nsub\n"
    assert (await sb.exec("test -f d/a.txt")).exit_code == 0
    assert (await sb.exec("[ -d d/nope ]")).exit_code == 1


async def test_sleep_uses_injected_clock_and_times_out() -> None:
    clock = FakeClock()
    _, sb = await _sb(clock)
    r = await sb.exec("sleep 5")
    assert r.ok and r.duration_s == 5.0 and clock.now() == 5.0
    r = await sb.exec("sleep 100; echo late", timeout_s=2)
    assert r.timed_out and r.exit_code is None and r.stdout == "" and r.duration_s == 2.0


async def test_budget_charges_exec_time_and_then_refuses() -> None:
    clock = FakeClock()
    backend = FakeBackend(clock)
    sb = await backend.start(SPEC, budget_s=10)
    assert (await sb.exec("sleep 4")).ok
    r = await sb.exec("sleep 30", timeout_s=20)
    assert r.budget_exhausted and not r.timed_out and r.duration_s == 6.0
    r = await sb.exec("echo hi")
    assert r.budget_exhausted and r.stdout == ""
    assert sb.usage().exec_seconds == 10.0


async def test_output_is_truncated_with_marker() -> None:
    _, sb = await _sb()
    await sb.write_file("/big", b"x" * 5000)
    r = await sb.exec("cat /big", output_limit=100)
    assert r.stdout_truncated
    assert TRUNCATION_MARKER.format(dropped=4900) in r.stdout
    assert r.stdout.startswith("x" * 50) and r.stdout.endswith("x" * 50)


async def test_snapshot_fork_siblings_are_independent() -> None:
    backend, sb = await _sb()
    await sb.exec("echo setup > /app/state")
    snap = await sb.snapshot()
    await sb.exec("echo after > /app/state")
    a, b = await backend.fork(snap, 2)
    await a.exec("echo mine > /app/state")
    assert (await b.read_file("/app/state")) == b"setup\n"
    assert (await a.read_file("/app/state")) == b"mine\n"
    assert (await sb.read_file("/app/state")) == b"after\n"


async def test_shell_keeps_cwd_and_variables() -> None:
    _, sb = await _sb()
    sh = await sb.shell()
    await sh.run("cd /tmp; X=5; export Y=7")
    r = await sh.run("pwd; echo $X $Y")
    assert r.stdout == "/tmp\n5 7\n"
    assert (await sb.exec("pwd")).stdout == "/app\n"  # exec does not share shell state


async def test_handlers_and_injected_start_failures() -> None:
    def pytest_(sb: FakeSandbox, args: list[str], stdin: bytes) -> tuple[int, bytes, bytes]:
        ok = sb.files.get("/app/fixed") == b"yes"
        return (0 if ok else 1), b"passed\n" if ok else b"failed\n", b""

    backend = FakeBackend(handlers={"pytest": pytest_}, fail_starts=1)
    with pytest.raises(SandboxStartError):
        await backend.start(SPEC)
    sb = await backend.start(SPEC)
    assert (await sb.exec("pytest -q")).exit_code == 1
    await sb.write_file("/app/fixed", b"yes")
    assert (await sb.exec("pytest -q")).stdout == "passed\n"
    assert sb.commands == ["pytest -q", "pytest -q"]


async def test_files_upload_download_and_close(tmp_path: Path) -> None:
    backend, sb = await _sb()
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "m.py").write_text("x = 1\n")
    await sb.upload(tmp_path / "src", "/app/src")
    assert (await sb.read_file("/app/src/pkg/m.py")) == b"x = 1\n"
    await sb.download("/app/src", tmp_path / "back")
    assert (tmp_path / "back" / "pkg" / "m.py").read_text() == "x = 1\n"
    with pytest.raises(FileNotFoundError):
        await sb.read_file("/nope")
    await backend.aclose()
    assert not sb.alive and backend.live == []
    await sb.close()  # idempotent
    with pytest.raises(SandboxError):
        await sb.exec("true")
