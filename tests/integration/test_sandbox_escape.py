"""The wider escape suite (#13 item 4): attempts from inside a REAL sandbox to reach or harm
the host or another sandbox. Each test looks for the harm on the host side (a process still
alive, a clock not moved, a mount table unchanged, a file not written), not only for a
non-zero exit inside, and has a positive control so it cannot pass vacuously.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from rollbank.errors import SandboxError
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.protocol import SandboxSpec

pytestmark = pytest.mark.integration

PTRACE = """python3 - {pid} <<'EOF'
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
pid = int(sys.argv[1])
if pid == 0:  # control: trace a child of our own
    pid = os.fork()
    if pid == 0:
        time.sleep(5)
        os._exit(0)
r = libc.ptrace(16, pid, None, None)  # PTRACE_ATTACH
print("ATTACHED" if r == 0 else f"DENIED {{ctypes.get_errno()}}")
EOF"""

KEYS = """python3 - {desc} {mine} <<'EOF'
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
found = libc.syscall(250, 10, -4, b"user", sys.argv[1].encode(), 0)
print("FOUND-HOST-KEY" if found > 0 else "NO-HOST-KEY")
made = libc.syscall(248, b"user", sys.argv[2].encode(), b"inner", 5, -4)
print("ADDED" if made > 0 else "ADD-FAILED")
print("SEES-OWN" if libc.syscall(250, 10, -4, b"user", sys.argv[2].encode(), 0) > 0 else "NO-OWN")
EOF
cat /proc/keys | wc -c"""

RAW = """python3 - <<'EOF'
import socket, sys
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", 0))
u.sendto(b"x", u.getsockname())
print("LOOPBACK-OK" if u.recv(1) == b"x" else "LOOPBACK-BROKEN")
print(sorted(n for _, n in socket.if_nameindex()))
ping = b"\\x08\\x00\\xf7\\xff\\x00\\x00\\x00\\x00"
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
except PermissionError:
    print("RAW-DENIED")
    sys.exit()
print("RAW-OPEN")
try:
    s.sendto(ping, ("{host}", 0))
    print("SENT-OUT")
except OSError as e:
    print("UNREACHABLE", e.errno)
EOF"""


async def start(backend: LocalBackend, base: Path) -> LocalSandbox:
    sb = await backend.start(SandboxSpec(layers=(base,)))
    assert isinstance(sb, LocalSandbox)
    return sb


def _status(pid: int, key: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return line.split(":", 1)[1].strip()
    return ""


def _read(path: str) -> str | None:
    p = Path(path)
    return p.read_text() if p.exists() else None


def _root_device() -> int:
    return Path("/").stat().st_dev


def _host_pids_running(word: str) -> set[int]:
    return {int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and word in _cmdline(int(p.name))}


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _host_ip() -> str:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))  # no packet is sent: picks the outgoing address
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.2"


async def test_ptrace_of_another_sandbox_or_the_host_fails(backend: LocalBackend, base: Path) -> None:
    a, b = await start(backend, base), await start(backend, base)
    await a.exec("nohup sleep 4343 >/dev/null 2>&1 &")
    (victim,) = [p for p in a.cgroup.pids() if "4343" in _cmdline(p)]
    host = subprocess.Popen(["sleep", "300"])  # noqa: ASYNC220 - a host process, ended below
    try:
        assert "ATTACHED" in (await b.exec(PTRACE.format(pid=0))).stdout  # control: own child
        for pid in (victim, host.pid, 1):
            r = await b.exec(PTRACE.format(pid=pid))
            assert "ATTACHED" not in r.stdout, (pid, r)
        for pid in (victim, host.pid):  # on the host: nobody traces them, they still run
            assert _status(pid, "TracerPid") == "0" and not _status(pid, "State").startswith("t")
    finally:
        host.kill()
        host.wait()


async def test_mount_and_umount_fail_and_the_mount_table_is_unchanged(backend: LocalBackend,
                                                                      base: Path) -> None:
    sb = await start(backend, base)
    before = _read(f"/proc/{sb.anchor_pid}/mountinfo")
    host_before = _read("/proc/self/mountinfo")
    r = await sb.exec("for c in 'umount /proc' 'umount -l /dev/.rollbank-pristine' "
                      "'mount --bind / /mnt' 'mount -t proc proc /mnt' 'mount -t sysfs s /sys' "
                      "'mount -t cgroup2 none /mnt' 'mount -o remount,rw /proc/sys'; do "
                      "$c 2>/dev/null && echo \"DID $c\"; done; ls -A /dev/.rollbank-pristine | wc -l")
    assert "DID" not in r.stdout and r.stdout.split()[-1] == "0", r
    assert _read(f"/proc/{sb.anchor_pid}/mountinfo") == before
    assert _read("/proc/self/mountinfo") == host_before
    assert (await sb.exec("grep -c ' /proc ' /proc/self/mountinfo")).stdout.strip() != "0"  # control


async def test_proc_and_sys_writes_do_not_reach_the_host(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    irq, thp = "/proc/irq/default_smp_affinity", "/sys/kernel/mm/transparent_hugepage/enabled"
    host_irq, host_thp = _read(irq), _read(thp)
    r = await sb.exec("cat /proc/irq/default_smp_affinity 2>/dev/null; "
                      "echo 1 > /proc/irq/default_smp_affinity 2>/dev/null && echo WROTE-IRQ; "
                      "echo never > /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null "
                      "&& echo WROTE-SYS; echo c > /proc/sysrq-trigger 2>/dev/null && echo SYSRQ; "
                      "ls -A /sys | wc -l")
    assert "WROTE" not in r.stdout and "SYSRQ" not in r.stdout, r
    assert r.stdout.split()[-1] == "0"  # no sysfs inside
    if host_irq is not None:
        assert r.stdout.startswith(host_irq)  # control: the same kernel file is readable
        assert _read(irq) == host_irq
    assert _read(thp) == host_thp


async def test_device_nodes_cannot_reach_host_disks(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    dev = _root_device()
    r = await sb.exec(f"mknod /tmp/disk b {os.major(dev)} {os.minor(dev)} 2>/dev/null; "
                      "echo read=$(head -c 4096 /tmp/disk 2>/dev/null | wc -c); "
                      "echo devs=$(ls /dev | tr '\\n' ' '); echo zero=$(head -c 16 /dev/zero | wc -c)")
    lines = dict(ln.split("=", 1) for ln in r.stdout.splitlines())
    assert lines["read"] == "0", r  # nothing read from the host's disk
    assert lines["zero"] == "16"  # control: the sandbox's own /dev works
    assert not any(n.startswith(("sd", "vd", "nvme", "loop", "mem", "kmsg")) for n in lines["devs"].split())


async def test_raw_sockets_see_only_loopback(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    r = await sb.exec(RAW.format(host=_host_ip()))
    assert "LOOPBACK-OK" in r.stdout and "['lo']" in r.stdout, r  # control; no host interface
    assert "SENT-OUT" not in r.stdout  # no raw packet leaves: denied, or unreachable
    assert "RAW-DENIED" in r.stdout or "UNREACHABLE" in r.stdout


_KEYCTL_SEARCH, _KEYCTL_REVOKE, _USER_KEYRING = 10, 3, -4


def _keys(*args: object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return int(libc.syscall(*args))


async def test_the_hosts_keyring_is_out_of_reach(backend: LocalBackend, base: Path) -> None:
    desc, mine = f"rollbank-host-{uuid.uuid4().hex[:8]}", f"rollbank-inner-{uuid.uuid4().hex[:8]}"
    key = _keys(248, b"user", desc.encode(), b"host-secret", 11, _USER_KEYRING)  # add_key
    assert key > 0
    try:  # control: the host finds its own key
        assert _keys(250, _KEYCTL_SEARCH, _USER_KEYRING, b"user", desc.encode(), 0) == key
        sb = await start(backend, base)
        r = await sb.exec(KEYS.format(desc=desc, mine=mine))
        assert "NO-HOST-KEY" in r.stdout and r.stdout.split()[-1] == "0", r  # /proc/keys masked
        if "ADDED" in r.stdout:
            assert "SEES-OWN" in r.stdout  # control: keyctl works inside
            assert _keys(250, _KEYCTL_SEARCH, _USER_KEYRING, b"user", mine.encode(), 0) < 0
    finally:
        _keys(250, _KEYCTL_REVOKE, key)


async def test_the_clock_cannot_be_changed(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    before = time.time()
    r = await sb.exec("date -s '2001-01-01 00:00:00' >/dev/null 2>&1 && echo SET; "
                      "python3 -c 'import time; time.clock_settime(time.CLOCK_REALTIME, 1e9)' "
                      "2>/dev/null && echo SET2; date +%Y")
    assert "SET" not in r.stdout, r
    assert abs(time.time() - before) < 3600  # the host clock did not jump to 2001
    assert r.stdout.strip() == time.strftime("%Y")  # control: the sandbox reads the real clock


async def test_host_processes_cannot_be_signalled(backend: LocalBackend, base: Path) -> None:
    host = subprocess.Popen(["sleep", "300"])  # noqa: ASYNC220 - a host process, ended below
    try:
        sb = await start(backend, base)
        await sb.exec("nohup sleep 777 >/dev/null 2>&1 &")
        r = await sb.exec(f"kill -9 {host.pid} {os.getpid()} 2>&1; kill -9 -1; echo sent")
        assert host.poll() is None  # still running on the host, and so is this test
        assert "sleep 777" not in (await sb.exec("ps -eo args")).stdout  # control: kill works
        assert r.signal == 9 or "sent" in r.stdout
    finally:
        host.kill()
        host.wait()


async def test_processes_cannot_leave_the_sandbox_cgroup(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    r = await sb.exec("cat /proc/self/cgroup; for f in /sys/fs/cgroup/cgroup.procs "
                      "/proc/1/root/sys/fs/cgroup/cgroup.procs; do echo $$ > $f 2>/dev/null "
                      "&& echo MOVED; done; nohup sleep 4545 >/dev/null 2>&1 & echo started")
    assert "MOVED" not in r.stdout, r
    assert "0::/x" in r.stdout  # a cgroup namespace: the sandbox's group is its root
    pids = _host_pids_running("4545")
    assert pids and pids <= set(sb.cgroup.pids())


async def test_downloads_refuse_links_out_of_the_destination(backend: LocalBackend, base: Path,
                                                            tmp_path: Path) -> None:
    target = Path("/tmp") / f"rollbank-escape-{uuid.uuid4().hex}"
    sb = await start(backend, base)
    await sb.exec("mkdir -p /out/ok && echo fine > /out/ok/f")
    await sb.download("/out/ok", tmp_path / "ok")
    assert (tmp_path / "ok" / "f").read_text() == "fine\n"  # control
    for link in ("ln -s /etc/passwd /out/l", f"ln -s ../../../../../..{target} /out/l"):
        await sb.exec(f"rm -f /out/l; {link}")
        with pytest.raises(SandboxError, match="unsafe"):
            await sb.download("/out", tmp_path / "out")
        assert not target.exists() and not (tmp_path / "out").exists()


def _as_nobody(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                           "/bin/sh", "-c", 'exec "$0"', str(path)],
                          capture_output=True, text=True, check=False)


def _open_run_dir() -> Path:
    """A run_dir other users can traverse (as an operator might configure one)."""
    d = Path(tempfile.mkdtemp(prefix="rollbank-escape-run-"))
    d.chmod(0o755)
    return d


async def test_snapshots_copy_links_not_host_files_and_keep_setuid_files_from_others(
        base: Path) -> None:
    run_dir = await asyncio.to_thread(_open_run_dir)
    try:
        async with LocalBackend(LocalSandboxConfig(run_dir=run_dir)) as backend:
            sb = await start(backend, base)
            await sb.exec("ln -s /etc/shadow /leak && cp /bin/true /suid && chmod 4755 /suid")
            snap = await sb.snapshot()
            frozen = snap.layers[-1]
            assert (frozen / "leak").is_symlink()
            assert str((frozen / "leak").readlink()) == "/etc/shadow"  # the link, not the file
            assert (frozen / "suid").stat().st_mode & 0o4000  # control: the copy is faithful
            r = await asyncio.to_thread(_as_nobody, frozen / "suid")
            assert r.returncode != 0 and "ermission denied" in r.stderr, r  # others: no way in
            (sib,) = await backend.fork(snap, 1)
            assert (await sib.exec("readlink /leak")).stdout == "/etc/shadow\n"
    finally:
        await asyncio.to_thread(shutil.rmtree, run_dir, True)
