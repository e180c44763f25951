"""In-memory fake sandbox backend for unit tests (no processes, no files on disk).

Owns :class:`FakeBackend`, :class:`FakeSandbox`, :class:`FakeSnapshot`, :class:`FakeShell`.
A sandbox is a ``dict`` of absolute path -> bytes run by the small shell interpreter of
:mod:`rollbank.sandbox.fake_interpreter` (lists, quoting, variables, redirections, common
builtins, handlers given to :class:`FakeBackend`); ``sleep`` advances the injected
:class:`~rollbank.clock.FakeClock`, else really sleeps.

Invariants (the protocol's): siblings forked from one snapshot share files and never each
other's writes; ``exec`` never raises for what a command did; output is bounded with
:data:`~rollbank.sandbox.protocol.TRUNCATION_MARKER`; the budget charges exec time (clock
time of ``sleep``) and ``exec`` past it returns ``budget_exhausted``; ``close`` is idempotent.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rollbank.clock import FakeClock
from rollbank.errors import SandboxError, SandboxStartError
from rollbank.sandbox.fake_interpreter import CommandTimeout, Interpreter, RunContext, ShellState
from rollbank.sandbox.local.proc import BoundedBuffer
from rollbank.sandbox.protocol import (
    DEFAULT_OUTPUT_LIMIT,
    ExecResult,
    Sandbox,
    SandboxBackend,
    SandboxSpec,
    SandboxUsage,
    ShellSession,
    Snapshot,
)

Handler = Callable[["FakeSandbox", list[str], bytes], tuple[int, bytes, bytes]]


@dataclass(frozen=True)
class FakeSnapshot:
    snapshot_id: str
    files: Mapping[str, bytes]
    spec: SandboxSpec


class FakeSandbox:
    """One fake sandbox. ``files`` is public so tests can plant and inspect state."""

    def __init__(self, backend: FakeBackend, sid: str, spec: SandboxSpec,
                 files: Mapping[str, bytes], budget_s: float | None) -> None:
        self.backend = backend
        self._id = sid
        self.spec = spec
        self.files: dict[str, bytes] = dict(files)
        self.budget_s = budget_s
        self.exec_seconds = 0.0  # billed seconds (host stall excluded)
        self.stall_seconds = 0.0
        self.commands: list[str] = []  # every command string run, for assertions
        # Seconds the host will stall the next command (a test's injected freeze): the
        # clock advances by them, the command is not billed for them.
        self.stall_next_s = 0.0
        self.closed = False

    @property
    def sandbox_id(self) -> str:
        return self._id

    @property
    def alive(self) -> bool:
        return not self.closed

    def _now(self) -> float:
        return self.backend.clock.now() if self.backend.clock else time.monotonic()

    async def exec(
        self, command: str | Sequence[str], *, timeout_s: float | None = None,
        cwd: str | None = None, env: Mapping[str, str] | None = None,
        stdin: bytes | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        state = ShellState(cwd or self.spec.workdir, {**self.spec.env, **(env or {})})
        if self.backend.exec_via_executor:
            await asyncio.get_running_loop().run_in_executor(None, len, str(command))
        return await self._run(command, state, timeout_s, stdin or b"", output_limit)

    async def _run(self, command: str | Sequence[str], state: ShellState, timeout_s: float | None,
                   stdin: bytes, limit: int) -> ExecResult:
        if self.closed:
            raise SandboxError(f"sandbox {self._id} is closed")
        text = command if isinstance(command, str) else shlex.join(command)
        self.commands.append(text)
        left = None if self.budget_s is None else self.budget_s - self.exec_seconds
        if left is not None and left <= 0:
            return ExecResult(None, None, "", "", 0.0, budget_exhausted=True)
        budget_bound = left is not None and (timeout_s is None or left < timeout_s)
        limit_s = left if budget_bound else timeout_s
        t0 = self._now()
        stall, self.stall_next_s = self.stall_next_s or self.backend.stall_s, 0.0
        cap = self.backend.max_host_stall_s
        if cap is not None and stall > cap:  # stopped by the host, never billed
            await self._sleep(cap, RunContext(None))
            self.stall_seconds += cap
            return ExecResult(None, 9, "", "", cap, stall_s=cap, host_stalled=True)
        if stall:
            await self._sleep(stall, RunContext(None))
        ctx = RunContext(None if limit_s is None else t0 + stall + limit_s)
        timed_out = False
        try:
            rc = await Interpreter(self.files, self.backend.handlers, self, self._sleep).run(
                text, state, ctx, stdin)
        except CommandTimeout:
            timed_out, rc = True, None
        duration = self._now() - t0
        self.exec_seconds += duration - stall
        self.stall_seconds += stall
        outs = []
        for raw in (ctx.out, ctx.err):
            buf = BoundedBuffer(limit)
            buf.feed(bytes(raw))
            outs.append(buf.text())
        return ExecResult(
            rc, 9 if timed_out else None, outs[0][0], outs[1][0], duration,
            timed_out=timed_out and not budget_bound, budget_exhausted=timed_out and budget_bound,
            stdout_truncated=outs[0][1], stderr_truncated=outs[1][1], stall_s=stall,
        )

    async def _sleep(self, seconds: float, ctx: RunContext) -> None:
        now = self._now()
        if ctx.deadline is not None and now + seconds > ctx.deadline:
            seconds = max(0.0, ctx.deadline - now)
            timeout = True
        else:
            timeout = False
        clock = self.backend.clock
        if clock is not None:
            clock.advance(seconds)
            await asyncio.sleep(0)
        else:
            await asyncio.sleep(seconds)
        if timeout:
            raise CommandTimeout

    # ---------------------------------------------------------------- files and the rest
    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._alive()
        self.files[str(PurePosixPath(path))] = bytes(data)

    async def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        self._alive()
        try:
            data = self.files[str(PurePosixPath(path))]
        except KeyError:
            raise FileNotFoundError(path) from None
        return data if limit is None else data[:limit]

    async def upload(self, local: Path, remote: str) -> None:
        items = await asyncio.to_thread(_read_tree, local)
        for rel, data in items:
            await self.write_file(str(PurePosixPath(remote) / rel) if rel else remote, data)

    async def download(self, remote: str, local: Path) -> None:
        self._alive()
        r = str(PurePosixPath(remote))
        items = [(k[len(r):].lstrip("/"), v) for k, v in self.files.items()
                 if k == r or k.startswith(r + "/")]
        if not items:
            raise FileNotFoundError(remote)
        await asyncio.to_thread(_write_tree, local, items)

    async def shell(self) -> ShellSession:
        self._alive()
        return FakeShell(self, ShellState(self.spec.workdir, dict(self.spec.env)))

    async def snapshot(self) -> FakeSnapshot:
        self._alive()
        return self.backend._new_snapshot(self.files, self.spec)

    def usage(self) -> SandboxUsage:
        return SandboxUsage(exec_seconds=self.exec_seconds, stall_seconds=self.stall_seconds)

    async def close(self) -> None:
        self.closed = True

    def _alive(self) -> None:
        if self.closed:
            raise SandboxError(f"sandbox {self._id} is closed")


class FakeShell:
    """A persistent fake shell: cwd and variables survive between ``run`` calls."""

    def __init__(self, sandbox: FakeSandbox, state: ShellState) -> None:
        self._sb = sandbox
        self._state = state

    async def run(self, command: str, *, timeout_s: float | None = None) -> ExecResult:
        return await self._sb._run(command, self._state, timeout_s, b"", DEFAULT_OUTPUT_LIMIT)

    async def close(self) -> None:
        if self._sb.backend.shell_close is not None:
            await self._sb.backend.shell_close()


class FakeBackend:
    """Fake :class:`~rollbank.sandbox.protocol.SandboxBackend`.

    ``clock``: a FakeClock that ``sleep`` advances (else real sleeps). ``handlers``: extra
    commands (name -> fn(sandbox, args, stdin) -> (exit code, stdout, stderr)).
    ``fail_starts``: the next N starts raise :class:`SandboxStartError` (infra faults).
    ``files``: what every started spec contains (the spec's layers are not read).
    ``stall_s``: the host stalls every command this long before it runs (not billed);
    ``max_host_stall_s``: a longer stall stops the command as ``host_stalled``.
    ``shell_close``: awaited by every shell session's ``close`` (e.g. one that hangs, as the
    close of a frozen sandbox's shell waits for it to exit).
    ``exec_via_executor``: every command first passes through the event loop's default
    executor, as the local backend's shell writes each command to its pipe
    (``sandbox/local/shell.py``).
    """

    def __init__(self, clock: FakeClock | None = None, *,
                 handlers: Mapping[str, Handler] | None = None, fail_starts: int = 0,
                 files: Mapping[str, bytes] | None = None, stall_s: float = 0.0,
                 max_host_stall_s: float | None = None,
                 shell_close: Callable[[], Awaitable[None]] | None = None,
                 exec_via_executor: bool = False) -> None:
        self.clock = clock
        self.exec_via_executor = exec_via_executor
        self.shell_close = shell_close
        self.stall_s = stall_s
        self.max_host_stall_s = max_host_stall_s
        self.handlers = dict(handlers or {})
        self.fail_starts = fail_starts
        self.base_files = dict(files or {})
        self.started: list[FakeSandbox] = []
        self._n = 0

    def _next_id(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def _new_snapshot(self, files: Mapping[str, bytes], spec: SandboxSpec) -> FakeSnapshot:
        return FakeSnapshot(self._next_id("fsnap"), dict(files), spec)

    async def start(self, spec: SandboxSpec, *, budget_s: float | None = None) -> FakeSandbox:
        return self._start(spec, self.base_files, budget_s)

    def _start(self, spec: SandboxSpec, files: Mapping[str, bytes],
               budget_s: float | None) -> FakeSandbox:
        if self.fail_starts > 0:
            self.fail_starts -= 1
            raise SandboxStartError("fake start failure (injected)")
        sb = FakeSandbox(self, self._next_id("fake"), spec, files, budget_s)
        self.started.append(sb)
        return sb

    async def fork(self, snapshot: Snapshot, n: int, *,
                   budget_s: float | None = None) -> list[Sandbox]:
        if not isinstance(snapshot, FakeSnapshot):
            raise SandboxError(f"not a fake snapshot: {snapshot!r}")
        return [self._start(snapshot.spec, snapshot.files, budget_s) for _ in range(n)]

    async def snapshot_spec(self, spec: SandboxSpec) -> FakeSnapshot:
        return self._new_snapshot(self.base_files, spec)

    async def aclose(self) -> None:
        for sb in self.started:
            await sb.close()

    @property
    def live(self) -> list[FakeSandbox]:
        return [s for s in self.started if s.alive]


def _read_tree(local: Path) -> list[tuple[str, bytes]]:
    if local.is_file():
        return [("", local.read_bytes())]
    return [(str(p.relative_to(local)), p.read_bytes()) for p in sorted(local.rglob("*"))
            if p.is_file()]


def _write_tree(local: Path, items: list[tuple[str, bytes]]) -> None:
    for rel, data in items:
        dst = local / rel if rel else local
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)


__all__ = ["FakeBackend", "FakeSandbox", "FakeShell", "FakeSnapshot", "Handler"]


def _conforms(b: FakeBackend) -> SandboxBackend:
    return b  # mypy checks FakeBackend against the protocol here
