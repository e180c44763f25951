"""SIGTERM, SIGINT and SIGKILL of a real ``rollbank train`` / ``rollbank collect`` process
leave no managed server process behind (issue #10).

The managed "vLLM server" is a stand-in (``collect.inference.managed.python``) shaped like the
one that was left orphaned: the API server forks an engine process (vLLM's EngineCore: same
process group, a grandchild of rollbank, out of ``PR_SET_PDEATHSIG``'s reach) and, like vLLM's
API server signalled while its engine starts, ignores SIGTERM; it never becomes healthy, so
rollbank is caught waiting for it. No vLLM is needed: seconds per case.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

STAND_IN = '''
import os, signal, sys, time
pids = os.environ["STAND_IN_PIDS"]
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # vLLM's API server while its engine starts
engine = os.fork()
if engine == 0:  # the "EngineCore": default signal handling, never told to stop
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    while True:
        time.sleep(1)
with open(f"{pids}/.{os.getpid()}", "w") as f:
    f.write(f"{os.getpid()} {engine}\\n")
os.rename(f"{pids}/.{os.getpid()}", f"{pids}/{os.getpid()}")
while True:  # never healthy: no port is ever opened
    time.sleep(1)
'''


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for(cond, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return bool(cond())


def start(command: str, tmp_path: Path) -> tuple[subprocess.Popen[bytes], list[int]]:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    exe = tmp_path / "fake-python"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} {script}\n')
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    pids = tmp_path / "pids"
    pids.mkdir()
    prefix = "collect." if command == "train" else ""
    args = [sys.executable, "-m", "rollbank.cli.main", command,
            "--set", f"{prefix}inference.managed.python={exe}",
            "--set", f"{prefix}inference.managed.stop_timeout_s=1",
            "--set", f"{prefix}inference.managed.num_servers=2",
            "--set", f"{prefix}inference.managed.run_dir={tmp_path / 'servers'}",
            "--set", f"{prefix}inference.calibrate=false",
            "--set", f"{prefix}sandbox.warm=false",
            "--set", f"{prefix}output={tmp_path / 'out'}"]
    env = dict(os.environ, STAND_IN_PIDS=str(pids))
    # A test command run as a background job of a script (`scripts/test.sh &`) has SIGINT
    # ignored, and an ignored signal stays ignored across exec: rollbank would never see the
    # SIGINT sent below (the test hung until its timeout). A handled signal is reset to the
    # default at exec, so the child starts as from a terminal. (Sync tests: the main thread.)
    restore = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    finally:
        signal.signal(signal.SIGINT, restore)
    started = wait_for(lambda: len([p for p in pids.iterdir() if not p.name.startswith(".")]) == 2
                       or proc.poll() is not None, 120)
    assert started and proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
    return proc, [int(x) for f in pids.iterdir() if not f.name.startswith(".")
                  for x in f.read_text().split()]


def sweep(pids: list[int]) -> list[int]:
    """The stand-in processes still running, then killed (a failed test leaves none)."""
    left = [p for p in pids if alive(p)]
    for p in left:
        with contextlib.suppress(OSError):
            os.kill(p, signal.SIGKILL)
    return left


@pytest.mark.parametrize(("command", "sig", "code"), [
    ("train", signal.SIGTERM, 143), ("collect", signal.SIGTERM, 143), ("collect", signal.SIGINT, 130),
])
def test_a_signal_stops_every_managed_process(command: str, sig: int, code: int,
                                              tmp_path: Path) -> None:
    """Regression: SIGTERM killed rollbank at once (no handler), the API server ignored the
    parent-death SIGTERM while starting and the engine never got one: both stayed."""
    proc, pids = start(command, tmp_path)
    try:
        assert len(pids) == 4 and all(alive(p) for p in pids)
        proc.send_signal(sig)
        rc = proc.wait(timeout=120)
        err = proc.stderr.read().decode() if proc.stderr else ""
        assert [p for p in pids if alive(p)] == [], err
        assert rc == code, err
    finally:
        sweep(pids)


def test_sigkill_leaves_no_managed_process(tmp_path: Path) -> None:
    """SIGKILL runs no clean-up in rollbank: the watchdog of process_groups stops every
    process carrying rollbank's owner token (SIGTERM, then SIGKILL after its grace, as this
    API server ignores SIGTERM)."""
    proc, pids = start("collect", tmp_path)
    try:
        proc.kill()
        proc.wait(timeout=30)
        assert wait_for(lambda: not any(alive(p) for p in pids), 60), [p for p in pids if alive(p)]
    finally:
        sweep(pids)
