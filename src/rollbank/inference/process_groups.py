"""Process groups of managed servers: none outlives rollbank, however rollbank ends.

Each managed server is started as the leader of its own process group
(``start_new_session``) with ``PR_SET_PDEATHSIG=SIGTERM`` (:func:`set_pdeathsig`). That
signal reaches only the direct child (vLLM's API server), and a vLLM API server signalled
while its engine is still starting ignored it here (it finished starting and served on);
its EngineCore and the engine's workers (same group, not rollbank's children) go on too. So:

- every live group is registered (:func:`register` / :func:`unregister`) and an ``atexit``
  hook SIGKILLs the registered groups (normal exit, an exception, an interrupted clean-up);
- every managed process carries this rollbank process's owner token in its environment
  (:func:`owned_env`; inherited by the engine processes it spawns), and a watchdog process,
  one per rollbank process, started with the first server in a session of its own, holds
  the read end of a pipe whose only write end rollbank holds. When rollbank ends in any way,
  SIGKILL included, the pipe reaches end-of-file: the watchdog SIGTERMs every process that
  carries the token, waits up to ``GRACE_S`` for them to exit, SIGKILLs what is left and
  exits. Found by token, not registered by pid, it also gets a server forked just before
  rollbank died, whose pid rollbank never learnt.

The clean path (``ManagedServers`` stopping, or SIGINT/SIGTERM turned into a cancellation by
the command line, :mod:`rollbank.cli.main`) stops each group itself first; these are the
backstops.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import secrets
import signal
import subprocess
import sys

GRACE_S = 5.0  # the watchdog's SIGTERM -> SIGKILL grace once rollbank is gone
TOKEN_ENV = "ROLLBANK_OWNER_TOKEN"

_WATCHDOG = r"""
import os, signal, sys, time
signal.signal(signal.SIGINT, signal.SIG_IGN)
mark, grace = ("%s=" % sys.argv[1]).encode() + sys.argv[2].encode(), float(sys.argv[3])
sys.stdin.buffer.read()  # returns at end-of-file: rollbank ended
def owned():
    me, found = os.getpid(), []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            try:
                with open(f"/proc/{name}/environ", "rb") as f:
                    if mark in f.read().split(b"\0"):
                        found.append(int(name))
            except OSError:
                pass
    return found
def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
for sig in (signal.SIGTERM, signal.SIGKILL, signal.SIGKILL):
    pids = owned()
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 1.0)
    while pids and time.monotonic() < deadline:
        time.sleep(0.1)
        pids = [p for p in pids if running(p)]
"""

# Process groups still alive, killed at interpreter exit whatever happened.
_LIVE: set[int] = set()
_owner: tuple[int, str] | None = None  # (pid of this rollbank process, its token)
_watchdog: subprocess.Popen[bytes] | None = None


def set_pdeathsig() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def owned_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` marked with this process's owner token, the watchdog running (see the module
    doc): a process started with it is stopped by the watchdog if rollbank ends first."""
    global _owner, _watchdog
    if _owner is None or _owner[0] != os.getpid():  # a forked child owns its own servers
        _owner, _watchdog = (os.getpid(), secrets.token_hex(8)), None
    if _watchdog is None or _watchdog.poll() is not None:
        _watchdog = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _WATCHDOG, TOKEN_ENV, _owner[1], str(GRACE_S)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)  # not in rollbank's group: a group kill spares it
    return {**env, TOKEN_ENV: _owner[1]}


def register(pgid: int) -> None:
    """``pgid`` is a live managed group: SIGKILLed at exit unless stopped before."""
    _LIVE.add(pgid)


def unregister(pgid: int) -> None:
    _LIVE.discard(pgid)


def is_live(pgid: int) -> bool:
    return pgid in _LIVE


def kill(pgid: int) -> None:
    """SIGKILL the whole group ``pgid`` (already gone: nothing) and unregister it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    unregister(pgid)


def kill_all() -> None:
    for pgid in list(_LIVE):
        kill(pgid)


def watchdog_pid() -> int | None:
    """The watchdog's pid while it runs (tests)."""
    return None if _watchdog is None or _watchdog.poll() is not None else _watchdog.pid


atexit.register(kill_all)
