"""A persistent shell inside a local sandbox.

Owns :class:`LocalShellSession`: one ``bash`` (``sh`` if absent) started through the sandbox's
exec path, fed commands on stdin. Framing: each command is sent base64-encoded to a helper
function that ``eval``\\ s it with stdin from ``/dev/null`` (so a command can never eat the
framing), then prints a per-command random sentinel and the exit status on stdout and the
sentinel on stderr. cwd, exported variables and shell variables survive between commands.

Invariants
- Output per command is bounded (head and tail kept, truncation marker).
- The timeout is in billed seconds (:mod:`rollbank.sandbox.billing`): time the host stalled
  the session's cgroup is not the model's; a stall beyond ``max_host_stall_s`` ends the
  command as ``host_stalled``.
- A command that exceeds its timeout, or that exits the shell, ends the session's processes
  (the session's cgroup is killed); the next :meth:`run` starts a fresh shell and the result
  of the failed command says so in ``stderr``. State does not survive that.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
import subprocess
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from rollbank.sandbox.billing import Bill, BilledDeadline, Verdict, bill
from rollbank.sandbox.local.proc import (
    MAX_HOST_STALL_S,
    BoundedBuffer,
    Meter,
    await_exit,
    wait_billed,
    wall_meter,
)
from rollbank.sandbox.protocol import DEFAULT_OUTPUT_LIMIT, ExecResult

PRELUDE = (
    "__rb_run() { __rb_c=$(printf %s \"$1\" | base64 -d); eval \"$__rb_c\" </dev/null; "
    "__rb_rc=$?; printf '\\n%s %d\\n' \"$2\" \"$__rb_rc\"; printf '\\n%s\\n' \"$2\" >&2; }\n"
)

Killer = Callable[[], Awaitable[None]]
Spawner = Callable[[], Coroutine[Any, Any, tuple[subprocess.Popen[bytes], Killer, Meter]]]
# (wall seconds used, the command's bill, requested timeout) -> (deadline, budget is binding)
Charger = Callable[[float, Bill | None, float | None], tuple[float | None, bool]]


class LocalShellSession:
    """See module docstring. Created by ``LocalSandbox.shell()``."""

    def __init__(self, spawn: Spawner, charge: Charger, output_limit: int = DEFAULT_OUTPUT_LIMIT,
                 *, max_host_stall_s: float = MAX_HOST_STALL_S):
        self._spawn = spawn
        self._charge = charge
        self._limit = output_limit
        self._max_stall = max_host_stall_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._kill: Killer = _nothing
        self._meter: Meter | None = None
        self._out = b""
        self._err = b""
        self._lock = asyncio.Lock()

    async def _ensure(self) -> subprocess.Popen[bytes]:
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:  # exited between commands: its pipes go with it
                _close_pipes(self._proc)
            self._proc, self._kill, self._meter = await self._spawn()
            self._out = self._err = b""
            assert self._proc.stdin is not None
            await self._write(PRELUDE.encode())
        return self._proc

    async def _write(self, data: bytes) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        loop = asyncio.get_running_loop()
        fd = self._proc.stdin.fileno()
        await loop.run_in_executor(None, os.write, fd, data)

    async def run(self, command: str, *, timeout_s: float | None = None) -> ExecResult:
        async with self._lock:
            deadline, budget_bound = self._charge(0.0, None, timeout_s)
            if deadline is not None and deadline <= 0:
                return ExecResult(None, None, "", "", 0.0, budget_exhausted=True)
            proc = await self._ensure()
            meter = self._meter or wall_meter
            token = "__RB_" + secrets.token_hex(8)
            payload = base64.b64encode(command.encode()).decode()
            t0 = time.monotonic()
            start = meter()
            out, err = BoundedBuffer(self._limit), BoundedBuffer(self._limit)
            timed_out = stalled = False
            collect = asyncio.ensure_future(self._collect(proc, token, out, err))
            try:
                await self._write(f"__rb_run {payload} {token}\n".encode())
                verdict = await wait_billed(
                    collect, BilledDeadline(start, deadline, self._max_stall), meter)
                timed_out = verdict is Verdict.TIMED_OUT
                stalled = verdict is Verdict.HOST_STALLED
                rc = None if verdict is not None else collect.result()
            except (BrokenPipeError, OSError):
                rc = None
            finally:
                if not collect.done():
                    collect.cancel()
                    with contextlib.suppress(BaseException):
                        await collect
            b = bill(start, meter())
            duration = time.monotonic() - t0
            self._charge(duration, b, None)
            stall = min(duration, b.stall_s)
            if rc is None:
                await self._kill()
                code = await await_exit(proc, 5.0)
                # This shell is done: close its pipes now (left to the garbage collector they
                # lingered, 3 descriptors per ended shell, seen in the fault soak's drained fds).
                _close_pipes(proc)
                if self._proc is proc:
                    self._proc = None
                note = "" if timed_out else "\n[rollbank: the shell exited; a new one starts]\n"
                so, st = out.text()
                se, et = err.text()
                exited = not timed_out and code is not None
                if stalled:
                    note = "\n[rollbank: the host stalled this command; it was stopped]\n"
                cut = timed_out or stalled
                return ExecResult(
                    code if exited and code is not None and code >= 0 else None,
                    9 if cut else (-code if exited and code is not None and code < 0 else None),
                    so, se + note, duration,
                    timed_out=timed_out and not budget_bound,
                    budget_exhausted=timed_out and budget_bound,
                    stdout_truncated=st, stderr_truncated=et, oom_killed=b.oom_kills > 0,
                    pids_limit_hit=b.pids_hits > 0, stall_s=stall, host_stalled=stalled,
                )
            so, st = out.text()
            se, et = err.text()
            return ExecResult(rc, None, so, se, duration, stdout_truncated=st, stderr_truncated=et,
                              oom_killed=b.oom_kills > 0, pids_limit_hit=b.pids_hits > 0,
                              stall_s=stall)

    async def _collect(
        self, proc: subprocess.Popen[bytes], token: str, out: BoundedBuffer, err: BoundedBuffer
    ) -> int | None:
        """Read both streams until each shows the sentinel; return the exit status."""
        assert proc.stdout is not None and proc.stderr is not None
        tail_out = ("\n" + token + " ").encode()
        tail_err = ("\n" + token + "\n").encode()
        rc: int | None = None
        done_err = False
        loop = asyncio.get_running_loop()
        while rc is None or not done_err:
            readable = await _wait_readable(loop, [proc.stdout.fileno(), proc.stderr.fileno()])
            for fd in readable:
                data = os.read(fd, 65536)
                if not data:
                    raise BrokenPipeError("shell exited")
                if fd == proc.stdout.fileno():
                    self._out += data
                    i = self._out.find(tail_out)
                    if i >= 0 and b"\n" in self._out[i + len(tail_out):]:
                        end = self._out.index(b"\n", i + len(tail_out))
                        rc = int(self._out[i + len(tail_out):end])
                        out.feed(self._out[:i])
                        self._out = self._out[end + 1:]
                    elif len(self._out) > 4096:
                        keep = len(tail_out) + 16
                        out.feed(self._out[:-keep])
                        self._out = self._out[-keep:]
                else:
                    self._err += data
                    i = self._err.find(tail_err)
                    if i >= 0:
                        err.feed(self._err[:i])
                        self._err = self._err[i + len(tail_err):]
                        done_err = True
                    elif len(self._err) > 4096:
                        keep = len(tail_err)
                        err.feed(self._err[:-keep])
                        self._err = self._err[-keep:]
        return rc

    async def close(self) -> None:
        if self._proc is not None:
            await self._kill()
            _close_pipes(self._proc)
            await await_exit(self._proc, 5.0)
            self._proc = None


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


async def _nothing() -> None:
    return None


async def _wait_readable(loop: asyncio.AbstractEventLoop, fds: list[int]) -> list[int]:
    fut: asyncio.Future[list[int]] = loop.create_future()
    ready: list[int] = []

    def _cb(fd: int) -> None:
        ready.append(fd)
        if not fut.done():
            fut.set_result(ready)

    for fd in fds:
        loop.add_reader(fd, _cb, fd)
    try:
        return await fut
    finally:
        for fd in fds:
            loop.remove_reader(fd)
