"""A persistent shell that ends (a command exits it, is killed or times out) gives back its
three pipes at once. Regression: they were left to the garbage collector, so the fault soak's
drained readings moved in steps of 3 descriptors (pipes of ended shells) until a collection
ran; the soak's verdict was "not flat" on fds."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from rollbank.sandbox.billing import Bill
from rollbank.sandbox.local.proc import Meter, wall_meter
from rollbank.sandbox.local.shell import LocalShellSession


def open_fds() -> int:
    """This process's open descriptors (as the soak counts them: not installed packages' files)."""
    fds = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            fds += "/site-packages/" not in str(fd.readlink())
        except OSError:
            continue
    return fds


def _session(spawned: list[subprocess.Popen[bytes]]) -> LocalShellSession:
    async def spawn() -> tuple[subprocess.Popen[bytes], Callable[[], Awaitable[None]], Meter]:
        # as LocalSandbox.shell spawns its shell: Popen (fork+exec, ~1 ms)
        proc = subprocess.Popen(["/bin/bash", "--noprofile", "--norc"], stdin=subprocess.PIPE,  # noqa: ASYNC220
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        spawned.append(proc)

        async def kill() -> None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)

        return proc, kill, wall_meter

    def charge(used: float, bill: Bill | None, timeout: float | None) -> tuple[float | None, bool]:
        return timeout, False

    return LocalShellSession(spawn, charge)


@pytest.mark.parametrize("ending", ["exit 7", "sleep 30"])
async def test_an_ended_shells_pipes_are_closed_when_it_ends(ending: str) -> None:
    spawned: list[subprocess.Popen[bytes]] = []
    session = _session(spawned)
    try:
        assert (await session.run("echo up", timeout_s=10)).stdout.strip() == "up"
        before = open_fds()
        res = await session.run(ending, timeout_s=1.0)
        assert res.exit_code is None or res.exit_code == 7
        first = spawned[0]
        assert all(p is not None and p.closed for p in (first.stdin, first.stdout, first.stderr))
        assert open_fds() == before - 3  # its three pipes, not left for the garbage collector
        assert (await session.run("echo again", timeout_s=10)).stdout.strip() == "again"
        assert len(spawned) == 2
    finally:
        await session.close()
    assert all(p.stdout is not None and p.stdout.closed for p in spawned)
