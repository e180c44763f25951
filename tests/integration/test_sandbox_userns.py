"""User-namespace id mapping (``userns = "mapped"``): the sandbox's root is an unprivileged
host uid. Each test runs a mapped backend and, as its control, the same steps with the mapping
off (root is host uid 0), and checks the difference on the host side: a test that passed with
the mapping off would show nothing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollbank.errors import IsolationUnavailableError
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.local.helper import helper_path
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.local.userns import probe_userns
from rollbank.sandbox.protocol import SandboxSpec

pytestmark = pytest.mark.integration

HOST_ID = 100000


@pytest.fixture(params=["mapped", "off"])
async def mapped(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[LocalBackend]:
    """A backend with the mapping ``mapped`` (the case under test) or ``off`` (the control)."""
    mode = request.param
    be = LocalBackend(LocalSandboxConfig(run_dir=tmp_path / "run", userns=mode,
                                         userns_host_id=HOST_ID))
    try:
        yield be
    finally:
        await be.aclose()


def _root_uid(backend: LocalBackend) -> int:
    """The host uid the sandbox's root must be under the backend's configuration."""
    return HOST_ID if backend.config.userns == "mapped" else 0


async def _start(backend: LocalBackend, base: Path) -> LocalSandbox:
    sb = await backend.start(SandboxSpec(layers=(base,)))
    assert isinstance(sb, LocalSandbox)
    assert (backend.userns is not None) == (backend.config.userns == "mapped")
    return sb


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


async def _running(sb: LocalSandbox, marker: str) -> list[int]:
    """The sandbox's processes whose command line holds ``marker``, waiting (bounded) for a
    background command to have exec'd: right after the shell forks it, the child still shows
    the shell's command line."""
    for _ in range(300):
        found = [p for p in sb.cgroup.pids() if marker in _cmdline(p)]
        if found:
            return found
        await asyncio.sleep(0.1)
    return []


def _ids(pid: int) -> tuple[int, int]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    uid = next(line for line in lines if line.startswith("Uid:")).split()[1:]
    gid = next(line for line in lines if line.startswith("Gid:")).split()[1:]
    assert len(set(uid)) == 1 and len(set(gid)) == 1, (uid, gid)  # real, effective, saved, fs
    return int(uid[0]), int(gid[0])


async def test_sandbox_processes_are_the_mapped_host_uid(mapped: LocalBackend, base: Path) -> None:
    sb = await _start(mapped, base)
    inside = await sb.exec("nohup sleep 4747 >/dev/null 2>&1 & id -u; id -g")
    assert inside.stdout == "0\n0\n"  # root inside either way
    assert await _running(sb, "4747")
    pids = sb.cgroup.pids()
    want = _root_uid(mapped)
    assert {_ids(p) for p in [*pids, sb.anchor_pid]} == {(want, want)}
    # the pinned (verifier) path enters as the sandbox's root too
    pinned = await sb.exec_pinned("nohup sleep 4848 >/dev/null 2>&1 & id -u", pins=["/usr"])
    assert pinned.stdout == "0\n", pinned
    (leftover,) = await _running(sb, "4848")
    assert _ids(leftover) == (want, want)


async def test_files_the_sandbox_writes_are_the_mapped_uid_on_the_host(
        mapped: LocalBackend, base: Path, tmp_path: Path) -> None:
    sb = await _start(mapped, base)
    r = await sb.exec("echo new > /tmp/new && echo more >> /etc/passwd && "
                      "cp /bin/true /suid && chmod 4755 /suid && stat -c %u:%g /tmp/new /suid")
    assert r.exit_code == 0 and r.stdout == "0:0\n0:0\n", r
    upper = Path(f"/proc/{sb.init_pid}/root{mapped.mount_dir}/upper")  # the writable layer
    want = _root_uid(mapped)
    for name in ("tmp/new", "etc/passwd", "suid"):  # new, copied up, made setuid
        st = (upper / name).lstat()
        assert (st.st_uid, st.st_gid) == (want, want), name
    snap = await sb.snapshot()
    frozen = snap.layers[-1]
    st = (frozen / "suid").lstat()
    # a setuid-root trick frozen in a snapshot is setuid to the mapped id, not to host root
    assert st.st_mode & stat.S_ISUID and st.st_uid == want
    # forks of the snapshot see their own root's files (the frozen layer is not shifted twice)
    (sib,) = await mapped.fork(snap, 1)
    assert isinstance(sib, LocalSandbox)
    r = await sib.exec("stat -c %u:%g /tmp/new /etc/passwd && echo sib >> /tmp/new && "
                       "tail -n1 /etc/passwd && cat /tmp/new")
    assert r.exit_code == 0 and r.stdout == "0:0\n0:0\nmore\nnew\nsib\n", r
    sib_upper = Path(f"/proc/{sib.init_pid}/root{mapped.mount_dir}/upper")
    assert (sib_upper / "tmp/new").stat().st_uid == want
    # files copied out still arrive
    await sib.download("/tmp/new", tmp_path / "new")
    assert (tmp_path / "new").read_text() == "new\nsib\n"


ESCAPED = """
echo owned >> "$1/root-0644" 2>/dev/null && echo WROTE-ROOT-FILE
cat "$1/root-0600" 2>/dev/null || echo NO-SECRET
echo mine >> "$1/open-0666" && echo WROTE-OPEN-FILE
"""


def _host_dir() -> Path:
    """Host-root-owned files in a directory others can traverse (/tmp/X, 0755)."""
    d = Path(tempfile.mkdtemp(prefix="rollbank-userns-"))
    d.chmod(0o755)
    for name, mode in (("root-0644", 0o644), ("root-0600", 0o600), ("open-0666", 0o666)):
        (d / name).write_text("host\n")
        (d / name).chmod(mode)
    (d / "root-0600").write_text("SECRET\n")
    return d


def _as_escaped(anchor: int, d: Path) -> subprocess.CompletedProcess[str]:
    """A process with the sandbox's credentials (its user namespace, uid 0 in it) that has
    left its mount namespace: what a kernel bug in the mount isolation would give a sandbox."""
    return subprocess.run(
        ["nsenter", f"--user=/proc/{anchor}/ns/user", "-S", "0", "-G", "0", "--",
         "/bin/sh", "-c", ESCAPED, "sh", str(d)],
        capture_output=True, text=True, check=False,
    )


async def test_an_escaped_process_cannot_write_or_read_host_root_files(
        mapped: LocalBackend, base: Path, request: pytest.FixtureRequest) -> None:
    sb = await _start(mapped, base)
    d = _host_dir()
    request.addfinalizer(lambda: shutil.rmtree(d, True))
    r = await asyncio.to_thread(_as_escaped, sb.anchor_pid, d)
    assert "WROTE-OPEN-FILE" in r.stdout, r  # control: the process ran and can write
    if mapped.config.userns == "mapped":
        assert "WROTE-ROOT-FILE" not in r.stdout and "NO-SECRET" in r.stdout, r
        assert (d / "root-0644").read_text() == "host\n"
        assert (d / "open-0666").stat().st_uid == 0  # appended to, not re-owned
    else:  # host root inside: it can
        assert "WROTE-ROOT-FILE" in r.stdout and "SECRET" in r.stdout, r


async def test_mapped_is_refused_without_the_helper_and_auto_falls_back(
        tmp_path: Path, base: Path) -> None:
    refuse = LocalBackend(LocalSandboxConfig(run_dir=tmp_path / "a", userns="mapped",
                                             use_helper=False))
    try:
        with pytest.raises(IsolationUnavailableError, match="rb-helper"):
            await refuse.start(SandboxSpec(layers=(base,)))
    finally:
        await refuse.aclose()
    async with LocalBackend(LocalSandboxConfig(run_dir=tmp_path / "b", use_helper=False)) as auto:
        sb = await auto.start(SandboxSpec(layers=(base,)))
        assert auto.userns is None and "rb-helper" in auto.userns_reason
        assert isinstance(sb, LocalSandbox) and _ids(sb.anchor_pid) == (0, 0)
    async with LocalBackend(LocalSandboxConfig(run_dir=tmp_path / "c")) as default:
        sb = await default.start(SandboxSpec(layers=(base,)))
        assert isinstance(sb, LocalSandbox)
        # auto maps by default wherever the probe passes (it does on this host, kernel 6.18)
        why = await asyncio.to_thread(probe_userns, helper_path(), default.mount_dir, HOST_ID,
                                      "/usr/bin/bwrap")
        can = why is None
        assert (default.userns is not None) == can, default.userns_reason
        assert _ids(sb.anchor_pid) == ((HOST_ID, HOST_ID) if can else (0, 0))
    assert os.geteuid() == 0


def test_the_probe_names_what_this_host_lacks(tmp_path: Path) -> None:
    helper = helper_path()
    assert helper is not None
    (tmp_path / "mnt").mkdir()
    assert probe_userns(helper, tmp_path / "mnt", HOST_ID, "/usr/bin/bwrap") is None
    why = probe_userns(helper, tmp_path / "no" / "mnt", HOST_ID, "/usr/bin/bwrap")
    assert why is not None and "open_tree" in why
    why = probe_userns(helper, tmp_path / "mnt", HOST_ID, str(tmp_path / "no-bwrap"))
    assert why is not None and "no-bwrap" in why
