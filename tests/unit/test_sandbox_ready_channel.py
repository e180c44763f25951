"""The start's ready channel (rollbank.sandbox.local.backend): a byte written by another
process arrives with that process's pid, as this process's pid namespace sees it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from rollbank.sandbox.local.backend import _ready_channel, _sender_pid


def test_the_byte_carries_the_writers_pid_and_eof_when_it_is_gone() -> None:
    mine, theirs = _ready_channel()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", f"import os; os.write({theirs}, b'1')"], pass_fds=(theirs,))
        os.close(theirs)
        assert proc.wait(timeout=30) == 0
        mine.setblocking(True)
        data, anc, _, _ = mine.recvmsg(1, socket.CMSG_SPACE(12))
        assert data == b"1"
        assert _sender_pid(anc) == proc.pid != os.getpid()
        assert mine.recv(1) == b""  # every writer gone: end of file
    finally:
        mine.close()


def test_no_credentials_no_pid() -> None:
    assert _sender_pid([]) is None
    assert _sender_pid([(socket.SOL_SOCKET, socket.SCM_RIGHTS, b"\0" * 12)]) is None
