"""Run one host process without threads: pipes and a pidfd watched by the event loop.

Owns bounded output capture (:class:`BoundedBuffer`: keeps the head and the tail, counts what
was dropped) and :func:`run_process`, which enforces a deadline by calling a caller-supplied
``kill`` (the sandbox kills the command's whole cgroup) and never waits forever for pipes held
open by background processes the command left behind.

Invariants
- Memory used per stream is bounded by the limit, whatever the command prints.
- :func:`run_process` returns only after the process has exited (it was killed if needed) and
  both pipes are closed on our side.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollbank.sandbox.billing import (
    Bill,
    BilledDeadline,
    DeadlineWatch,
    StallReading,
    Verdict,
    bill,
)
from rollbank.sandbox.protocol import TRUNCATION_MARKER

Meter = Callable[[], StallReading]  # reads the command's cgroup counters now
Killer = Callable[[subprocess.Popen[bytes]], Awaitable[None] | None]
#: Default cap on the host stall credited to one command (see ``rollbank.sandbox.billing``).
MAX_HOST_STALL_S = 600.0


def wall_meter() -> StallReading:
    """A meter that sees no stall: billing falls back to wall time."""
    return StallReading(time.monotonic())


async def await_exit(proc: subprocess.Popen[bytes], limit_s: float) -> int | None:
    """``proc.wait(timeout)`` without blocking the event loop (asyncio-sleep polling)."""
    deadline = time.monotonic() + limit_s
    delay = 0.0005
    while (rc := proc.poll()) is None and time.monotonic() < deadline:
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.05)
    return rc


async def wait_billed(
    done: asyncio.Future[Any], deadline: BilledDeadline, meter: Meter
) -> Verdict | None:
    """Wait for ``done`` until the command's *billed* time reaches the deadline.

    Returns None when ``done`` completed, else :attr:`Verdict.TIMED_OUT` or
    :attr:`Verdict.HOST_STALLED` (``done`` is left running; the caller kills).
    """
    watch = DeadlineWatch(deadline)
    wait = watch.first_wait()
    while True:
        try:
            await asyncio.wait_for(asyncio.shield(done), wait)
            return None
        except TimeoutError:
            decision = watch.check(meter())
            if decision.verdict is not Verdict.WAIT:
                return decision.verdict
            wait = decision.wait_s

#: After the process exits, how long to wait for pipes still held by background children.
PIPE_GRACE_S = 0.05
_CHUNK = 65536


class BoundedBuffer:
    """Keeps the first and last ``limit // 2`` bytes of a stream; counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = max(0, limit)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit - self.limit // 2 - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data and self.limit // 2:
            self.tail += data
            if len(self.tail) > self.limit // 2:
                del self.tail[: len(self.tail) - self.limit // 2]

    @property
    def dropped(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def raw(self) -> bytes:
        return bytes(self.head) + bytes(self.tail)

    def text(self) -> tuple[str, bool]:
        """Decoded text (UTF-8, replacement characters) and whether it was truncated."""
        if self.dropped <= 0:
            return self.raw().decode("utf-8", errors="replace"), False
        marker = TRUNCATION_MARKER.format(dropped=self.dropped)
        head = bytes(self.head).decode("utf-8", errors="replace")
        tail = bytes(self.tail).decode("utf-8", errors="replace")
        return head + marker + tail, True


@dataclass
class ProcessResult:
    returncode: int
    stdout: BoundedBuffer
    stderr: BoundedBuffer
    duration_s: float
    deadline_hit: bool  # the command's billed time reached the deadline
    bill: Bill | None = None
    host_stalled: bool = False  # killed because the host stalled it beyond the cap


async def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    stdin: bytes | None,
    limit: int,
    deadline_s: float | None,
    kill: Killer,
    on_spawn: Callable[[subprocess.Popen[bytes]], None] | None = None,
    meter: Meter = wall_meter,
    max_host_stall_s: float = MAX_HOST_STALL_S,
) -> ProcessResult:
    """Run ``argv``; when its billed time (``meter``; wall time by default) reaches
    ``deadline_s`` call ``kill(proc)`` (sync or async); capture bounded stdout/stderr."""
    loop = asyncio.get_running_loop()
    t0 = time.monotonic()
    start = meter()
    # Popen (fork+exec, ~1 ms) watched by a pidfd: no child-watcher threads.
    proc = subprocess.Popen(  # noqa: ASYNC220
        list(argv),
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        close_fds=True,
        start_new_session=True,
    )
    if on_spawn is not None:
        on_spawn(proc)
    pidfd = os.pidfd_open(proc.pid)
    exited = loop.create_future()
    bufs = (BoundedBuffer(limit), BoundedBuffer(limit))
    eofs = [loop.create_future(), loop.create_future()]
    pipes = [proc.stdout, proc.stderr]
    fds = []
    for i, pipe in enumerate(pipes):
        assert pipe is not None
        fd = pipe.fileno()
        os.set_blocking(fd, False)
        fds.append(fd)

        def _readable(i: int = i, fd: int = fd) -> None:
            try:
                data = os.read(fd, _CHUNK)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if data:
                bufs[i].feed(data)
            else:
                loop.remove_reader(fd)
                if not eofs[i].done():
                    eofs[i].set_result(None)

        loop.add_reader(fd, _readable)

    def _exited() -> None:
        loop.remove_reader(pidfd)
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(pidfd, _exited)
    writer: asyncio.Task[None] | None = None
    if stdin:
        writer = asyncio.create_task(_feed_stdin(proc, stdin))
    deadline_hit = stalled = False
    end: StallReading | None = None
    try:
        verdict = await wait_billed(exited, BilledDeadline(start, deadline_s, max_host_stall_s), meter)
        if verdict is not None:
            end = meter()  # before the kill: the bill ends where the deadline fired
            deadline_hit = verdict is Verdict.TIMED_OUT
            stalled = verdict is Verdict.HOST_STALLED
            await _call(kill, proc)
            await exited
        else:
            end = meter()
        # Background children may keep the pipes open: give them a moment, then stop reading.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*eofs), PIPE_GRACE_S)
        # Drain whatever is already buffered in the pipes.
        for i, fd in enumerate(fds):
            while not eofs[i].done():
                try:
                    data = os.read(fd, _CHUNK)
                except (BlockingIOError, OSError):
                    break
                if not data:
                    break
                bufs[i].feed(data)
    finally:
        for fd in (*fds, pidfd):
            loop.remove_reader(fd)
        if not exited.done():
            await _call(kill, proc)
        if writer is not None:
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await writer
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        os.close(pidfd)
        rc = await await_exit(proc, 10.0)  # already exited (or killed): no blocking wait
        returncode = proc.wait() if rc is None else rc
    b = bill(start, end) if end is not None else None
    return ProcessResult(returncode, bufs[0], bufs[1], time.monotonic() - t0, deadline_hit,
                         b, stalled)


async def _call(kill: Killer, proc: subprocess.Popen[bytes]) -> None:
    r = kill(proc)
    if inspect.isawaitable(r):
        await r


async def _feed_stdin(proc: subprocess.Popen[bytes], data: bytes) -> None:
    assert proc.stdin is not None
    loop = asyncio.get_running_loop()
    fd = proc.stdin.fileno()
    os.set_blocking(fd, False)
    view = memoryview(data)
    try:
        while view:
            try:
                n = os.write(fd, view[:_CHUNK])
                view = view[n:]
            except BlockingIOError:
                ready = loop.create_future()
                loop.add_writer(fd, ready.set_result, None)
                try:
                    await ready
                finally:
                    loop.remove_writer(fd)
            except BrokenPipeError:
                return
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()


def exiting(stat: bytes) -> bool:
    """PF_EXITING in /proc/<pid>/stat's flags (field 9): the process is on its way out."""
    try:
        return bool(int(stat.rsplit(b")", 1)[-1].split()[6]) & 0x4)
    except (ValueError, IndexError):
        return False
