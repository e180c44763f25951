"""A real distribution registry (Debian's ``docker-registry``) on 127.0.0.1 for a test module:
the tools it and image building need, checked; started on a free port with its storage under
``work``; stopped when the block ends."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollbank.inference.server import free_port

TOOLS = ("docker-registry", "skopeo", "umoci")


def run(*argv: str, timeout: float = 120) -> str:
    """``argv``'s stdout; the test fails with its stderr if it exits non-zero."""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=timeout)
    assert proc.returncode == 0, f"{argv}: {proc.stderr}"
    return proc.stdout


@contextlib.contextmanager
def serving(work: Path) -> Iterator[str]:
    """A registry serving from ``work``/storage while the block runs; yields its ``host:port``."""
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        pytest.fail(f"{missing} not installed: run scripts/setup.sh")
    host = f"127.0.0.1:{free_port()}"
    (work / "registry.yml").write_text(
        "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {work / 'storage'}\n"
        f"http:\n  addr: {host}\n")
    server = subprocess.Popen(["docker-registry", "serve", str(work / "registry.yml")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with urllib.request.urlopen(f"http://{host}/v2/", timeout=2):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "registry did not start"
                time.sleep(0.1)
        yield host
    finally:
        server.terminate()
        server.wait(timeout=10)
