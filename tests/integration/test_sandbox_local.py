"""LocalBackend on this machine: exec semantics, files, shell, snapshot/fork, cleanup.

Real sandboxes (bubblewrap + overlayfs + cgroups) on the Debian base from
``rollbank.tasks.bases``. Security properties are in ``test_sandbox_security.py``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rollbank.errors import SandboxStartError
from rollbank.sandbox.local.backend import LocalBackend
from rollbank.sandbox.local.cgroups import CgroupLayout
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.protocol import Limits, SandboxSpec

pytestmark = pytest.mark.integration


def spec(base: Path, **kw: object) -> SandboxSpec:
    return SandboxSpec(layers=(base,), **kw)  # type: ignore[arg-type]


async def start(backend: LocalBackend, base: Path, **kw: object) -> LocalSandbox:
    sb = await backend.start(spec(base, **kw))
    assert isinstance(sb, LocalSandbox)
    return sb


def _host_mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


async def test_exec_reports_exit_signal_streams_cwd_env_stdin(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base, workdir="/app", env={"FROM_SPEC": "s"})
    r = await sb.exec("echo out; echo err >&2; exit 3")
    assert (r.exit_code, r.signal, r.stdout, r.stderr) == (3, None, "out\n", "err\n")
    r = await sb.exec("kill -TERM $$")
    assert r.exit_code is None and r.signal == signal.SIGTERM
    r = await sb.exec(["pwd"])
    assert r.stdout == "/app\n"
    r = await sb.exec("pwd; echo $FROM_SPEC $EXTRA", cwd="/tmp", env={"EXTRA": "e"})
    assert r.stdout == "/tmp\ns e\n"
    r = await sb.exec("cat | tr a-z A-Z", stdin=b"hello")
    assert r.stdout == "HELLO"
    r = await sb.exec("printf 'ok \\377\\376 end'")
    assert r.ok and r.stdout == "ok \ufffd\ufffd end"
    assert (await sb.exec("hostname")).stdout == "sandbox\n"
    big = "x" * 300_000  # over the kernel's 128 KiB cap on one argument
    r = await sb.exec(f"cat > /tmp/big <<'EOF'\n{big}\nEOF\nwc -c < /tmp/big; exit 5")
    assert (r.exit_code, r.stdout) == (5, "300001\n")
    assert (await sb.exec("ls -A /tmp")).stdout == "big\n"  # the script file is gone
    r = await sb.exec("echo a\0b")  # a model can emit NUL bytes: data, not an exception
    assert r.exit_code == 2 and "NUL" in r.stderr


async def test_step_timeout_kills_the_whole_command_tree(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    before = set(sb.cgroup.pids())
    r = await sb.exec("sleep 300 & setsid sleep 301 & sleep 302", timeout_s=0.5)
    assert r.timed_out and r.exit_code is None and not r.budget_exhausted
    for _ in range(3000):  # killed; a loaded host may take > 1 s to finish them (bound: 30 s)
        if set(sb.cgroup.pids()) == before:
            break
        await asyncio.sleep(0.01)
    assert set(sb.cgroup.pids()) == before  # daemons of the timed-out command are gone
    ps = await sb.exec("ps -eo args")
    assert "sleep 30" not in ps.stdout
    assert (await sb.exec("echo alive")).stdout == "alive\n"


async def test_background_process_of_a_finished_command_survives(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    r = await sb.exec("nohup sleep 400 >/dev/null 2>&1 & echo started")
    assert r.ok and r.stdout == "started\n"
    assert "sleep 400" in (await sb.exec("ps -eo args")).stdout


async def test_orphans_are_reaped_by_the_sandbox_init(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    await sb.exec("for i in 1 2 3 4 5; do (sleep 0.05 &) ; done")
    states = ""
    for _ in range(600):  # wait (bounded) for the orphans to exit
        states = (await sb.exec("ps -eo stat=,args=")).stdout
        if "sleep 0.05" not in states:
            break
        await asyncio.sleep(0.05)
    assert "sleep 0.05" not in states and "Z" not in [line.split()[0][0] for line in states.splitlines()]
    assert "rollbank-init" in (await sb.exec("cat /proc/1/comm")).stdout


async def test_budget_is_charged_and_then_exhausted(backend: LocalBackend, base: Path) -> None:
    sb = await backend.start(spec(base), budget_s=1.0)
    r = await sb.exec("sleep 5", timeout_s=10)
    assert r.budget_exhausted and not r.timed_out
    assert sb.usage().exec_seconds >= 1.0
    r = await sb.exec("echo never")
    assert r.budget_exhausted and r.stdout == ""


async def test_files_roundtrip_upload_download(backend: LocalBackend, base: Path, tmp_path: Path) -> None:
    sb = await start(backend, base)
    await sb.write_file("/app/deep/dir/x.sh", b"#!/bin/sh\necho ran\n", mode=0o755)
    assert (await sb.exec("/app/deep/dir/x.sh")).stdout == "ran\n"
    assert await sb.read_file("/app/deep/dir/x.sh", limit=9) == b"#!/bin/sh"
    with pytest.raises(FileNotFoundError):
        await sb.read_file("/nope/missing")
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "m.py").write_bytes(b"\x00\xffbinary")
    await sb.upload(src, "/work/src")
    assert await sb.read_file("/work/src/pkg/m.py") == b"\x00\xffbinary"
    await sb.exec("mkdir -p /out/sub && echo result > /out/sub/r.txt")
    await sb.download("/out", tmp_path / "out")
    assert (tmp_path / "out" / "sub" / "r.txt").read_text() == "result\n"


async def test_shell_session_keeps_state_and_recovers_from_exit(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    sh = await sb.shell()
    assert (await sh.run("cd /tmp && X=41 && export Y=$((X+1))")).ok
    r = await sh.run("pwd; echo $X $Y; echo warn >&2; printf no-newline")
    assert r.stdout == "/tmp\n41 42\nno-newline" and r.stderr == "warn\n"
    assert (await sh.run("read line; echo got=$line")).stdout == "got=\n"  # stdin is not framing
    r = await sh.run("sleep 30", timeout_s=0.3)
    assert r.timed_out
    assert (await sh.run("echo fresh $X")).stdout == "fresh\n"  # new shell, state reset
    r = await sh.run("exit 7")
    assert r.exit_code == 7 and "shell exited" in r.stderr
    assert (await sh.run("echo back")).stdout == "back\n"
    await sh.close()


async def test_snapshot_and_fork_share_setup_not_writes(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    await sb.exec("mkdir -p /app && echo expensive > /app/setup.txt && rm /etc/issue")
    snap = await sb.snapshot()
    await sb.exec("echo later > /app/later.txt")  # after the snapshot: not in siblings
    siblings = await backend.fork(snap, 3)
    for s in siblings:
        r = await s.exec("cat /app/setup.txt; test -e /etc/issue || echo issue-deleted; test -e /app/later.txt && echo leak")
        assert r.stdout == "expensive\nissue-deleted\n"
    await siblings[0].exec("echo mine > /app/setup.txt")
    assert (await siblings[1].read_file("/app/setup.txt")) == b"expensive\n"
    # a snapshot of a fork stacks another frozen layer
    snap2 = await siblings[0].snapshot()
    (grand,) = await backend.fork(snap2, 1)
    assert (await grand.read_file("/app/setup.txt")) == b"mine\n"
    assert (await sb.exec("echo still running")).ok


async def test_snapshot_spec_forks_pristine_state(backend: LocalBackend, base: Path) -> None:
    snap = await backend.snapshot_spec(spec(base))
    a, b = await backend.fork(snap, 2)
    await a.exec("touch /root/a")
    assert (await b.exec("ls /root")).stdout == ""
    with pytest.raises(SandboxStartError):
        await backend.snapshot_spec(spec(base / "does-not-exist"))


async def test_close_kills_everything_and_leaves_no_mounts_or_cgroups(backend: LocalBackend, base: Path) -> None:
    sb = await start(backend, base)
    await sb.exec("nohup sleep 500 >/dev/null 2>&1 &")
    pids = sb.cgroup.pids()
    assert len(pids) >= 3  # outer bwrap, the sandbox's pid 1, the daemon
    groups = [*sb.cgroup.v1.values(), *([sb.cgroup.v2] if sb.cgroup.v2 else [])]
    await sb.close()
    await sb.close()
    assert not sb.alive
    assert [p for p in pids if _alive(p)] == []
    assert not any(map(os.path.isdir, groups))
    assert "rollbank-upper" not in _host_mounts()


def test_orchestrator_sigkill_leaves_nothing_behind(base: Path, tmp_path: Path) -> None:
    """A child orchestrator is SIGKILLed holding a sandbox with a daemon: all of it dies."""
    run = tmp_path / "run"
    child = textwrap.dedent(f"""
        import asyncio, sys
        from pathlib import Path
        from rollbank.sandbox.local.backend import LocalBackend
        from rollbank.sandbox.local.config import LocalSandboxConfig
        from rollbank.sandbox.protocol import SandboxSpec
        async def main():
            be = LocalBackend(LocalSandboxConfig(run_dir=Path({str(run)!r})))
            sb = await be.start(SandboxSpec(layers=(Path({str(base)!r}),)))
            await sb.exec("nohup setsid sleep 777 >/dev/null 2>&1 &")
            snap = await sb.snapshot()
            print(" ".join(map(str, sb.cgroup.pids())), flush=True)
            await asyncio.sleep(3600)
        asyncio.run(main())
    """)
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) >= 3 and all(Path(f"/proc/{p}").exists() for p in pids)
        owner_dirs = [d for d in run.iterdir() if d.name.startswith("o")]
        assert owner_dirs  # the child's snapshot directory exists
    finally:
        proc.send_signal(signal.SIGKILL)  # also when an assertion above failed: never leak it
        proc.wait()
    alive = pids
    for _ in range(1200):  # wait (bounded) for the kernel to deliver the death signals
        alive = [p for p in pids if _alive(p)]
        if not alive:
            break
        time.sleep(0.025)
    assert alive == []
    # the next backend reaps the dead orchestrator's cgroups and snapshot directories
    reaped = LocalBackend(LocalSandboxConfig(run_dir=run)).reap()
    assert reaped >= 1
    assert not any(d.exists() for d in owner_dirs)
    layout_roots = [Path("/sys/fs/cgroup/pids"), Path("/sys/fs/cgroup/unified")]
    tag = f"o{proc.pid}-"
    assert not any(tag in str(p) for root in layout_roots for p in root.rglob("o*-*"))
    assert "rollbank-upper" not in _host_mounts()


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


async def test_start_failure_is_a_typed_error_and_cleans_up(backend: LocalBackend, base: Path) -> None:
    with pytest.raises(SandboxStartError):
        await backend.start(SandboxSpec(layers=(base / "missing",)))
    layout = CgroupLayout.detect()
    assert layout.v2 is None or [p for p in layout.v2.iterdir() if p.is_dir()] == []
    assert backend.sandboxes == []
    assert os.getpid() > 0  # the orchestrator survived


async def test_limits_are_capped_by_operator_config(tmp_path: Path, base: Path) -> None:
    cfg = LocalSandboxConfig(run_dir=tmp_path / "r", max_memory_mb=128, max_processes=64)
    async with LocalBackend(cfg) as be:
        sb = await be.start(spec(base, limits=Limits(memory_mb=100000, max_processes=100000)))
        assert isinstance(sb, LocalSandbox)
        assert sb.spec.limits.memory_mb == 128 and sb.spec.limits.max_processes == 64
        mem = sb.cgroup.v1.get("memory")
        if mem is not None:
            assert int((mem / "memory.limit_in_bytes").read_text()) == 128 << 20


async def test_shell_tool_path_without_helper(tmp_path: Path, base: Path) -> None:
    """The fallback (sh + mount + nsenter + setpriv) keeps the same semantics."""
    cfg = LocalSandboxConfig(run_dir=tmp_path / "r", use_helper=False)
    async with LocalBackend(cfg) as be:
        sb = await be.start(spec(base, workdir="/tmp"))
        r = await sb.exec("pwd; exit 4")
        assert (r.exit_code, r.stdout) == (4, "/tmp\n")
        assert (await sb.exec("sleep 30", timeout_s=0.3)).timed_out
        r = await sb.exec("grep CapBnd /proc/self/status; mount -t tmpfs x /mnt || echo denied")
        assert "denied" in r.stdout and "000001ffffffffff" not in r.stdout
        snap = await sb.snapshot()
        (child,) = await be.fork(snap, 1)
        assert (await child.exec("echo ok")).stdout == "ok\n"


async def test_warm_pool_over_real_sandboxes(backend: LocalBackend, base: Path) -> None:
    from rollbank.sandbox.config import WarmPoolConfig
    from rollbank.sandbox.pool import WarmPool

    async with WarmPool(backend, WarmPoolConfig(prestart=2)) as pool:
        await pool.prewarm("task", spec(base))
        stocked = [sb.sandbox_id for sb in backend.sandboxes]
        assert len(stocked) == 2
        group = await pool.fork("task", spec(base), 3)
        assert {sb.sandbox_id for sb in group} >= set(stocked)
        outs = await asyncio.gather(*(sb.exec("hostname && echo $$") for sb in group))
        assert all(r.ok for r in outs)
        await group[0].exec("echo mid > /root/progress")
        pool.put("task", await group[0].snapshot())
        (sibling,) = await pool.fork("task", spec(base), 1)
        assert await sibling.read_file("/root/progress") == b"mid\n"
    in_use = {sb.sandbox_id for sb in [*group, sibling]}
    assert {sb.sandbox_id for sb in backend.sandboxes} == in_use  # stock closed on exit


async def test_tmux_terminal_for_keystroke_agents(backend: LocalBackend, base: Path) -> None:
    from rollbank.sandbox.local.terminal import TmuxTerminal

    sb = await start(backend, base)
    term = TmuxTerminal(sb, width=80, height=24)
    await term.start(cwd="/tmp")
    await term.send(["echo $((6*7)) > answer; cat answer", "Enter"])
    screen = ""
    for _ in range(600):  # wait (bounded) for bash to run the line
        screen = await term.capture()
        if "\n42" in screen:
            break
        await asyncio.sleep(0.05)
    assert "\n42" in screen
    assert await sb.read_file("/tmp/answer") == b"42\n"
    await term.send(["sleep 100", "Enter", "C-c"])
    await term.close()
    assert "tmux" not in (await sb.exec("ps -eo comm")).stdout


async def test_isolation_unavailable_is_a_clear_error_never_a_fallback(tmp_path: Path, base: Path) -> None:
    from rollbank.errors import IsolationUnavailableError

    cfg = LocalSandboxConfig(run_dir=tmp_path / "r", bwrap=str(tmp_path / "no-bwrap"))
    async with LocalBackend(cfg) as be:
        with pytest.raises(IsolationUnavailableError, match="no-bwrap is missing"):
            await be.start(spec(base))
        assert be.sandboxes == []
