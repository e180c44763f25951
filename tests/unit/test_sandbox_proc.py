"""Bounded output capture and the process runner (real host processes, no sandbox)."""

from __future__ import annotations

import os
import signal
import subprocess

from rollbank.sandbox.local.proc import BoundedBuffer, run_process
from rollbank.sandbox.protocol import TRUNCATION_MARKER


def test_bounded_buffer_keeps_head_and_tail_and_counts_drops() -> None:
    buf = BoundedBuffer(10)
    for chunk in (b"abc", b"defgh", b"ijklmnop", b"qrst"):
        buf.feed(chunk)
    assert buf.total == 20 and buf.dropped == 10
    text, truncated = buf.text()
    assert truncated
    assert text == "abcde" + TRUNCATION_MARKER.format(dropped=10) + "pqrst"


def test_bounded_buffer_untruncated_and_invalid_utf8() -> None:
    buf = BoundedBuffer(100)
    buf.feed(b"ok \xff\xfe \xe2\x82\xac")
    assert buf.text() == ("ok \ufffd\ufffd \u20ac", False)
    assert buf.raw() == b"ok \xff\xfe \xe2\x82\xac"


async def test_run_process_deadline_calls_kill_and_returns() -> None:
    killed: list[int] = []

    def kill(proc: subprocess.Popen[bytes]) -> None:
        killed.append(proc.pid)
        proc.kill()

    res = await run_process(["/bin/sleep", "30"], env={}, stdin=None, limit=100,
                            deadline_s=0.2, kill=kill)
    assert res.deadline_hit and killed and res.returncode == -9


async def test_run_process_stdin_streams_and_background_pipe_holders() -> None:
    res = await run_process(["/bin/sh", "-c", "cat; echo err >&2"], env={"PATH": "/bin"},
                            stdin=b"x" * 300_000, limit=1000, deadline_s=10,
                            kill=lambda p: p.kill())
    assert res.returncode == 0 and res.stdout.total == 300_000 and res.stdout.dropped == 299_000
    assert res.stderr.raw() == b"err\n"
    # a daemon that keeps stdout open does not make the call wait for it
    res = await run_process(["/bin/sh", "-c", "sleep 30 & echo $!"], env={"PATH": "/bin"},
                            stdin=None, limit=1000, deadline_s=10, kill=lambda p: p.kill())
    daemon = int(res.stdout.raw())
    try:
        assert res.returncode == 0 and not res.deadline_hit
        os.kill(daemon, 0)  # still running: the call returned without waiting for it
    finally:
        os.kill(daemon, signal.SIGKILL)
