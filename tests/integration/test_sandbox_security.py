"""Isolation of LocalBackend sandboxes. Each test fails if the property it names breaks.

Every test has a positive control (the same probe succeeds where it should: on the host, or
inside the sandbox itself), so a probe that could never succeed does not pass vacuously.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import uuid
from pathlib import Path

import pytest

from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.protocol import Limits, SandboxSpec

pytestmark = pytest.mark.integration

CONNECT = """python3 - <<'EOF'
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(2)
try:
    s.connect((sys.argv[1] if len(sys.argv) > 1 else "{host}", {port}))
    print("CONNECTED")
except OSError as exc:
    print("FAILED", exc)
EOF"""


async def start(backend: LocalBackend, base: Path, **limits: int) -> LocalSandbox:
    sb = await backend.start(SandboxSpec(layers=(base,), limits=Limits(**limits)))
    assert isinstance(sb, LocalSandbox)
    return sb


def _sysctl(key: str) -> str:
    return Path("/proc/sys", key).read_text().strip()


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def _host_ips() -> list[str]:
    ips = {"127.0.0.1"}
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))
            ips.add(s.getsockname()[0])
    except OSError:
        pass
    return sorted(ips)


async def test_no_network_but_loopback_inside_works(backend: LocalBackend, base: Path) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    try:
        for ip in _host_ips():
            socket.create_connection((ip, port), timeout=2).close()  # control: host reaches it
            sb = await start(backend, base)
            r = await sb.exec(CONNECT.format(host=ip, port=port))
            assert r.stdout.startswith("FAILED"), (ip, r)
        inside = await sb.exec(
            "python3 -c \"import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); "
            "s.listen(); socket.create_connection(s.getsockname()); print('CONNECTED')\""
        )
        assert inside.stdout == "CONNECTED\n", inside
        r = await sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1")
        assert r.stdout.split() == ["lo"]  # the only interface
    finally:
        listener.close()


async def test_network_only_when_the_operator_allows_it(tmp_path: Path, base: Path) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    ip = _host_ips()[-1]
    probe = CONNECT.format(host=ip, port=port)
    try:
        cfg = LocalSandboxConfig(run_dir=tmp_path / "net", allow_network=True)
        async with LocalBackend(cfg) as be:
            wants = await be.start(SandboxSpec(layers=(base,), network=True))
            assert (await wants.exec(probe)).stdout.startswith("CONNECTED")  # probe works
            default = await be.start(SandboxSpec(layers=(base,)))
            assert (await default.exec(probe)).stdout.startswith("FAILED")
        async with LocalBackend(LocalSandboxConfig(run_dir=tmp_path / "nonet")) as be:
            wants = await be.start(SandboxSpec(layers=(base,), network=True))
            assert (await wants.exec(probe)).stdout.startswith("FAILED")  # operator said no
    finally:
        listener.close()


async def test_cannot_read_host_root_or_host_files(backend: LocalBackend, base: Path) -> None:
    secret = uuid.uuid4().hex
    paths = [Path("/root") / f".rollbank-secret-{secret}", Path("/tmp") / f"rollbank-secret-{secret}"]
    for p in paths:
        p.write_text(secret)
    try:
        sb = await start(backend, base)
        for p in paths:
            r = await sb.exec(f"cat {p}; grep -rl {secret} /root /tmp /proc/1/root/tmp 2>/dev/null")
            assert secret not in r.stdout
            assert r.exit_code != 0
        r = await sb.exec("ls /work /.cache 2>&1; cat /proc/1/root/etc/hostname 2>&1")
        assert "rollbank" not in r.stdout  # the host's project tree is not visible
        assert (await sb.exec("cat /root/.bashrc >/dev/null && echo own-root-ok")).stdout == "own-root-ok\n"
    finally:
        for p in paths:
            p.unlink()


async def test_host_environment_is_not_inherited(backend: LocalBackend, base: Path) -> None:
    os.environ["ROLLBANK_TEST_HOST_SECRET"] = "s3cr3t-" + uuid.uuid4().hex
    try:
        sb = await start(backend, base)
        r = await sb.exec("env; cat /proc/1/environ /proc/self/environ | tr '\\0' '\\n'")
        assert "s3cr3t-" not in r.stdout and "ROLLBANK_TEST_HOST_SECRET" not in r.stdout
        assert "PATH=" in r.stdout  # control: the sandbox's own environment is there
    finally:
        del os.environ["ROLLBANK_TEST_HOST_SECRET"]


async def test_sandboxes_cannot_see_each_others_files_or_processes(backend: LocalBackend, base: Path) -> None:
    a = await start(backend, base)
    b = await start(backend, base)
    secret = uuid.uuid4().hex
    await a.exec(f"echo {secret} > /tmp/a-secret; nohup sleep 4242 >/dev/null 2>&1 &")
    assert secret in (await a.exec("cat /tmp/a-secret")).stdout  # control
    r = await b.exec("cat /tmp/a-secret")
    assert r.exit_code != 0 and secret not in r.stdout
    r = await b.exec(f"grep -rls {secret} /tmp /proc/*/root/tmp /proc/*/root/root")
    assert r.stdout == ""
    assert "sleep 4242" not in (await b.exec("ps -eo args")).stdout
    host_pids = [p for p in a.cgroup.pids() if "4242" in _cmdline(p)]
    assert host_pids
    r = await b.exec(f"kill -9 {' '.join(map(str, host_pids))} 2>&1; pkill -9 -f 'sleep 4242'; echo done")
    assert "sleep 4242" in (await a.exec("ps -eo args")).stdout  # still alive: b could not signal it
    assert all(_cmdline(p) for p in host_pids)


async def test_cannot_change_host_kernel_settings(backend: LocalBackend, base: Path) -> None:
    """Mapped root is host uid 0, and sysctl writes are checked by uid: /proc/sys must be
    read-only. The probe writes the *current* value, so even a broken sandbox changes nothing."""
    sb = await start(backend, base)
    for key in ("vm/swappiness", "kernel/core_pattern", "vm/drop_caches"):
        value = _sysctl(key) if key != "vm/drop_caches" else "0"
        r = await sb.exec(f"echo '{value}' > /proc/sys/{key} && echo WROTE")
        assert "WROTE" not in r.stdout, key
    r = await sb.exec("cat /proc/sys/vm/swappiness")
    assert r.stdout.strip() == _sysctl("vm/swappiness")  # control: the same kernel setting
    r = await sb.exec("cat /proc/kcore /proc/keys 2>&1 | head -c 100 | wc -c; ls /proc/acpi | wc -l")
    assert r.stdout.split()[1] == "0"  # masked


async def test_killing_everything_inside_does_not_kill_the_sandbox(backend: LocalBackend, base: Path) -> None:
    """`kill -9 -1` is the model's doing: its processes die, the sandbox does not (a dead
    sandbox would be reported as an infrastructure failure and dodge the penalty)."""
    sb = await start(backend, base)
    await sb.exec("nohup sleep 999 >/dev/null 2>&1 &")
    r = await sb.exec("kill -9 -1; kill -9 1; kill -TERM 1; echo after")
    assert sb.alive
    ps = ""
    for _ in range(300):  # SIGKILLed: gone once it is scheduled to exit (bound: 30 s)
        if "sleep 999" not in (ps := (await sb.exec("ps -eo args")).stdout):
            break
        await asyncio.sleep(0.1)
    assert "sleep 999" not in ps  # the model's daemon died
    assert (await sb.exec("echo still-usable")).stdout == "still-usable\n"
    assert r.signal == 9 or r.stdout == "after\n"


async def test_writes_stay_in_the_sandbox_layer(backend: LocalBackend, base: Path) -> None:
    def digest() -> str:
        h = hashlib.sha256()
        for rel in ("etc/passwd", "usr/bin/ls", "etc/hostname"):
            p = base / rel
            h.update(rel.encode() + (p.read_bytes() if p.exists() else b"<missing>"))
        names = [p.name for p in (*base.iterdir(), *(base / "tmp").iterdir())]
        h.update(str(sorted(names)).encode())
        return h.hexdigest()

    before = digest()
    sb = await start(backend, base)
    r = await sb.exec(
        "echo evil:x:0:0::/:/bin/sh >> /etc/passwd && rm -f /usr/bin/ls && echo x > /etc/hostname"
        " && mkdir /newdir && touch /tmp/dropped && rm -rf /var/lib/dpkg && echo ok"
    )
    assert r.stdout == "ok\n"
    assert "evil" in (await sb.exec("tail -1 /etc/passwd")).stdout  # control: write visible inside
    assert digest() == before
    assert (base / "var/lib/dpkg").is_dir()
    r = await sb.exec("mount -t tmpfs x /mnt 2>&1 || echo mount-denied")
    assert "mount-denied" in r.stdout  # no CAP_SYS_ADMIN even in its own namespaces
    r = await sb.exec("unshare -U -r true 2>&1 || echo userns-denied")
    assert "userns-denied" in r.stdout  # and no nested user namespace to regain it


async def test_memory_limit_contains_a_blowup(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base, memory_mb=96)
    r = await sb.exec("python3 -c 'b = bytearray(400 << 20); print(len(b))'")
    assert r.exit_code != 0 and "419430400" not in r.stdout
    assert r.oom_killed or "MemoryError" in r.stderr
    u = sb.usage()
    assert u.memory_limit_hit or "MemoryError" in r.stderr
    assert (u.peak_memory_bytes or 0) <= (96 << 20) + (1 << 20)
    ok = await sb.exec("python3 -c 'b = bytearray(16 << 20); print(len(b))'")  # control
    assert ok.stdout == "16777216\n"


async def test_fork_bomb_is_contained_by_the_pids_limit(backend: LocalBackend, base: Path) -> None:
    """The bomb runs until its command's deadline kills its group. The command's shell forks
    once (``bomb &``; dash forks each element of a pipeline from the shell itself) and then
    ``exec``s its sleep: a fork after the bomb started could lose the race for a pid slot, the
    shell would exit at once and leave the bomb running in the background, where it could
    saturate the limit and make the next command's fork fail with EAGAIN (flaky under load)."""
    sb = await start(backend, base, max_processes=48)
    idle = set(sb.cgroup.pids())  # the sandbox's own init processes
    peak = 0
    bombing = asyncio.create_task(
        sb.exec("bomb() { bomb | bomb & }; bomb & exec sleep 600", timeout_s=3))
    while not bombing.done():  # sample the process count while the bomb runs
        peak = max(peak, len(sb.cgroup.pids()))
        await asyncio.sleep(0.01)
    r = bombing.result()
    assert r.timed_out, r  # it ran until its deadline: the bomb did not take the host down
    assert sb.usage().pids_limit_hit  # the kernel refused forks at the limit
    assert len(idle) < peak <= 48
    for _ in range(3000):  # the bomb's processes die with its command group (bound: 30 s)
        if set(sb.cgroup.pids()) <= idle:
            break
        await asyncio.sleep(0.01)
    assert set(sb.cgroup.pids()) <= idle
    assert (await sb.exec("echo survived")).stdout == "survived\n"


#: takes every pid slot the sandbox's limit allows, and again each one a process frees
PID_HOG = ("perl -e 'for (;;) { my $p = fork; if (!defined $p) { select(undef, undef, undef, "
           "0.005); next } if (!$p) { sleep 600; exit } }' >/dev/null 2>&1 &")


async def test_a_command_left_no_pid_by_the_sandboxs_processes_is_a_result(
        backend: LocalBackend, base: Path) -> None:
    """Regression: rb-helper could not fork the command ("rb-helper: fork: EAGAIN") and the
    sandbox raised SandboxError (the runtime's failure: infra) although the kernel counted
    the refusal against the sandbox's own pids limit (the model's processes). Now it is the
    command's result; the sandbox stays usable once the leftovers are killed."""
    sb = await start(backend, base, max_processes=24)
    assert (await sb.exec(PID_HOG)).exit_code == 0
    for _ in range(1500):  # the hog fills the limit (bound: 15 s)
        if len(sb.cgroup.pids()) >= 24:
            break
        await asyncio.sleep(0.01)
    assert len(sb.cgroup.pids()) >= 24
    r = await sb.exec("echo hi")
    assert (r.exit_code, r.stdout, r.pids_limit_hit) == (126, "", True), r
    assert "hold every pid" in r.stderr and "rb-helper: fork" in r.stderr
    assert sb.usage().pids_limit_hit and sb.alive
    await sb.kill_leftovers()
    assert (await sb.exec("echo survived")).stdout == "survived\n"  # control


async def test_disk_filler_hits_the_storage_limit(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base, storage_mb=32, memory_mb=512)
    r = await sb.exec("dd if=/dev/zero of=/tmp/fill bs=1M count=200 2>&1; stat -c %s /tmp/fill")
    assert "No space left on device" in r.stdout
    assert int(r.stdout.split()[-1]) <= 32 << 20
    ok = await sb.exec("rm /tmp/fill && dd if=/dev/zero of=/tmp/small bs=1M count=8 2>&1 && echo fine")
    assert ok.stdout.endswith("fine\n")  # control: space is back after deleting


async def test_file_size_rlimit(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base, max_file_size_mb=1, storage_mb=64)
    r = await sb.exec("dd if=/dev/zero of=/tmp/big bs=1M count=4 2>&1; stat -c %s /tmp/big")
    assert int(r.stdout.split()[-1]) <= 1 << 20


async def test_output_flood_is_truncated(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    r = await sb.exec("head -c 50000000 /dev/zero | tr '\\0' 'a'; head -c 3000000 /dev/urandom >&2",
                      output_limit=4096)
    assert r.ok and r.stdout_truncated and r.stderr_truncated
    assert len(r.stdout) < 4096 + 200 and "49995904 bytes dropped" in r.stdout
    assert len(r.stderr.encode()) < 3 * 4096 + 200
