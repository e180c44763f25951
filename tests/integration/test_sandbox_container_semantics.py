"""Container semantics tasks rely on, on REAL sandboxes (issue 26): the files a container
runtime writes (``/etc/hosts``, ``/etc/hostname``, ``/etc/resolv.conf``).

Before: the base image's ``/etc/hosts`` was absent, so ``localhost`` did not resolve in a
sandbox (this test failed with ``gaierror``) and ``/etc/hostname`` was the build host's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.protocol import SandboxSpec

pytestmark = pytest.mark.integration

SERVE = ("python3 -c 'import socket; s = socket.socket(); s.bind((\"localhost\", 0)); s.listen();"
         " c = socket.create_connection((\"localhost\", s.getsockname()[1])); print(\"connected\")'")


async def test_localhost_resolves_and_the_runtime_files_are_written(backend: LocalBackend,
                                                                    base: Path) -> None:
    sb = await backend.start(SandboxSpec(layers=(base,), hostname="box-7"))
    r = await sb.exec("python3 -c 'import socket; print(socket.gethostbyname(\"localhost\"))'; cat /etc/hostname; " + SERVE + "; "
                      "grep -c '^nameserver 127\\.' /etc/resolv.conf; "
                      "grep -c '^127.0.1.1\tbox-7$' /etc/hosts; stat -c %a /etc/hosts")
    lines = r.stdout.splitlines()
    assert lines[0] == "127.0.0.1" and lines[1:] == ["box-7", "connected", "0", "1",
                                                              "644"], r
    # the agent's to edit, as in a container; a fork writes its own again
    assert (await sb.exec("echo '10.1.2.3 db' >> /etc/hosts && getent hosts db")).exit_code == 0
