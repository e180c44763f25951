"""One running local sandbox: exec (and pinned exec), files, shell, snapshot, usage, close.
Started by :class:`~rollbank.sandbox.local.backend.LocalBackend` (assembly: ``runtime``).

Invariants
- ``exec`` never raises for what the command did; a dead runtime raises
  :class:`~rollbank.errors.SandboxDiedError`. A command the sandbox's own processes leave
  no pid for is a result (exit 126, ``pids_limit_hit``; :func:`.helper_failure.helper_failure`).
- Every command runs in its own cgroup below the sandbox's; a step timeout kills that whole
  group (the command and everything it spawned, daemons included).
- Time is billed as :mod:`rollbank.sandbox.billing` says: a command's wall time minus what
  the host measurably stalled it (its cgroup frozen, or all its tasks waiting for a CPU,
  its own CPU-quota throttling excluded). Step timeouts and the per-episode budget are in
  billed seconds; only ``exec`` and shell commands are billed (not file transfers); a command
  cut by the budget is flagged ``budget_exhausted``; one stalled by the host beyond
  ``max_host_stall_s`` is killed and flagged ``host_stalled``.
- OOM kills and process-limit refusals are counted per command (deltas of the sandbox's
  counters around it): :meth:`usage` reports the last command's, so an earlier OOM never
  explains a later death.
- ``close`` kills every process of the sandbox (cgroup kill), reaps the anchor, removes the
  cgroups; the mounts die with the sandbox's mount namespace. Idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from rollbank.errors import SandboxDiedError, SandboxError
from rollbank.sandbox.billing import Bill
from rollbank.sandbox.local.cgroups import SandboxCgroup
from rollbank.sandbox.local.helper_failure import NO_PID, HelperFailure, failure_of
from rollbank.sandbox.local.proc import (
    MAX_HOST_STALL_S,
    Meter,
    ProcessResult,
    await_exit,
    exiting,
    run_process,
)
from rollbank.sandbox.local.runtime import (
    DEFAULT_PATH,
    env_pins,
    exec_argv,
    expand_pins,
    outermost,
)
from rollbank.sandbox.local.shell import LocalShellSession
from rollbank.sandbox.local.snapshot import LocalSnapshot, copy_tree
from rollbank.sandbox.local.transfer import pack, unpack
from rollbank.sandbox.local.user import as_user
from rollbank.sandbox.protocol import (
    DEFAULT_OUTPUT_LIMIT,
    ExecResult,
    SandboxSpec,
    SandboxUsage,
    ShellSession,
)

_FILE_LIMIT = 1 << 31
_ARG_LIMIT = 96 * 1024


class SandboxOwner(Protocol):
    """What a sandbox needs of the backend that started it
    (:class:`~rollbank.sandbox.local.backend.LocalBackend`): where snapshots go, and to be told
    of a new snapshot and of its own end."""

    @property
    def snapshot_dir(self) -> Path: ...

    def register_snapshot(self, snap: LocalSnapshot) -> None: ...

    def forget(self, sb: LocalSandbox) -> None: ...


class LocalSandbox:
    """A sandbox anchored by its pid 1 inside bubblewrap; see module docstring."""

    def __init__(
        self,
        *,
        sandbox_id: str,
        spec: SandboxSpec,
        backend: SandboxOwner,
        init: subprocess.Popen[bytes],
        anchor_pid: int,
        cgroup: SandboxCgroup,
        mount_dir: Path,
        rlimits: str,
        drop_caps: bool,
        budget_s: float | None,
        helper: Path | None = None,
        rlimit_vals: tuple[str, str] = ("1024", str(1 << 30)),
        max_host_stall_s: float = MAX_HOST_STALL_S,
    ) -> None:
        self._id = sandbox_id
        self.spec = spec
        self._backend = backend
        self._init = init
        self.anchor_pid = anchor_pid
        self.cgroup = cgroup
        self._mount_dir = mount_dir
        self._rlimits = rlimits
        self._helper = helper
        self._rlimit_vals = rlimit_vals
        self._drop_caps = drop_caps
        self._budget = budget_s
        self._exec_s = 0.0
        self._stall_s = 0.0
        self._max_stall = max_host_stall_s
        self._closed = False
        self._teardown: asyncio.Future[None] | None = None
        self._shells: list[LocalShellSession] = []
        self._oom_base = cgroup.oom_kills()
        self._pids_base = cgroup.pids_limit_hits()
        self._last: Bill | None = None  # the last command's bill (its OOM / pids events)
        self.channel_dir: Path | None = None  # the agent channel (backend: agent_channels)

    # ---------------------------------------------------------------- identity / state
    @property
    def sandbox_id(self) -> str:
        return self._id

    @property
    def init_pid(self) -> int:
        return self._init.pid

    @property
    def alive(self) -> bool:
        if self._closed or self._init.poll() is not None:
            return False
        try:  # a dying anchor (exiting, or a zombie bwrap has not reaped) is not alive
            stat = Path(f"/proc/{self.anchor_pid}/stat").read_bytes()
        except OSError:
            return False
        return stat.rsplit(b")", 1)[-1].split()[:1] not in ([b"Z"], [b"X"]) and not (
            exiting(stat))

    async def _settled_alive(self, res: ProcessResult) -> bool:
        """``alive``, after a SIGKILLed command gave a dying sandbox a moment to show it
        (the host killing the sandbox kills the command first)."""
        if res.returncode in (-9, 137) and not res.deadline_hit and not res.host_stalled:
            for _ in range(20):
                if not self.alive:
                    return False
                await asyncio.sleep(0.01)
        return self.alive

    def _env(self, extra: Mapping[str, str] | None) -> dict[str, str]:
        env = {"PATH": DEFAULT_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb"}
        env.update(self.spec.env)
        if extra:
            env.update(extra)
        return env

    def _charge(self, used: float, timeout_s: float | None) -> tuple[float | None, bool]:
        """Add ``used`` billed seconds; return (deadline of the next command in billed
        seconds, budget is binding)."""
        self._exec_s += used
        if self._budget is None:
            return timeout_s, False
        left = self._budget - self._exec_s
        if timeout_s is None or left < timeout_s:
            return max(0.0, left), True
        return timeout_s, False

    # ---------------------------------------------------------------- exec
    async def _run(
        self,
        command: str | Sequence[str],
        *,
        cwd: str | None,
        env: Mapping[str, str] | None,
        stdin: bytes | None,
        limit: int,
        deadline_s: float | None,
        pins: Sequence[str] | None = None,
    ) -> ProcessResult:
        if self._closed:
            raise SandboxError(f"sandbox {self._id} is closed")
        if not self.alive:
            raise SandboxDiedError(f"sandbox {self._id} is not running")
        group, files = self.cgroup.new_exec_group()
        argv = exec_argv(
            anchor_pid=self.anchor_pid, procs_files=files, rlimits=self._rlimits,
            command=command, cwd=cwd or self.spec.workdir, drop_caps=self._drop_caps,
            helper=self._helper, rlimit_vals=self._rlimit_vals, pins=pins,
        )

        async def kill(proc: subprocess.Popen[bytes]) -> None:
            await self.cgroup.akill_exec_group(group)
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)

        try:
            res = await run_process(
                argv, env=self._env(env), stdin=stdin, limit=limit, deadline_s=deadline_s,
                kill=kill, meter=lambda: self.cgroup.reading(group, time.monotonic()),
                max_host_stall_s=self._max_stall,
            )
        finally:
            self.cgroup.drop_exec_group(group)
        self._last = res.bill
        if res.returncode != 0 and not await self._settled_alive(res):
            raise SandboxDiedError(
                f"sandbox {self._id} died during a command: "
                + res.stderr.raw().decode(errors="replace")[-500:]
            )
        if failure_of(res) is HelperFailure.RUNTIME:
            raise SandboxError(  # the runtime (cgroups, setns...) failed, not the command
                f"sandbox {self._id}: " + res.stderr.raw().decode(errors="replace")[:500]
            )
        return res

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        return await self._exec(command, timeout_s=timeout_s, cwd=cwd, env=env, stdin=stdin,
                                output_limit=output_limit)

    async def kill_leftovers(self) -> None:
        """SIGKILL everything the sandbox's commands left running (its init stays)."""
        await self.cgroup.akill_exec_groups()

    @property
    def can_pin(self) -> bool:  # the shell-tool path (no rb-helper) cannot build the view
        return self._helper is not None

    async def exec_pinned(self, command: str | Sequence[str], *, pins: Sequence[str],
                          timeout_s: float | None = None, cwd: str | None = None,
                          env: Mapping[str, str] | None = None, stdin: bytes | None = None,
                          output_limit: int = DEFAULT_OUTPUT_LIMIT) -> ExecResult:
        """``exec`` in a root assembled from the pristine layers' toolchain and the agent's
        state (``rb-helper vexec``, ``csrc/pins.c``): ``pins`` (globs allowed) and every
        directory the command's environment names as its toolchain (:func:`.runtime.env_pins`:
        PATH...) show the pristine layers' version; files the agent added at ``/`` are gone."""
        if not self.can_pin:
            raise SandboxError("pinned commands need rb-helper (no C compiler on this host)")
        wanted = [*pins, *env_pins(self._env(env), self.spec.layers, cwd or self.spec.workdir)]
        return await self._exec(command, timeout_s=timeout_s, cwd=cwd, env=env, stdin=stdin,
                                output_limit=output_limit,
                                pins=outermost(expand_pins(wanted, self.spec.layers)))

    async def _exec(self, command: str | Sequence[str], *, timeout_s: float | None,
                    cwd: str | None, env: Mapping[str, str] | None, stdin: bytes | None,
                    output_limit: int, pins: Sequence[str] | None = None) -> ExecResult:
        deadline, budget_bound = self._charge(0.0, timeout_s)
        if deadline is not None and deadline <= 0:
            return ExecResult(None, None, "", "", 0.0, budget_exhausted=True)
        words = [command] if isinstance(command, str) else list(command)
        if any("\0" in w for w in [*words, cwd or "", *(env or {}).keys(), *(env or {}).values()]):
            # execve cannot carry NUL bytes: the command is invalid, like a shell syntax error
            return ExecResult(2, None, "", "rollbank: the command contains a NUL byte\n", 0.0)
        if isinstance(command, str) and len(command.encode()) > _ARG_LIMIT:
            # one argv string is capped at 128 KiB by the kernel (MAX_ARG_STRLEN): big scripts
            # (here-documents writing files) run from a file instead
            script = f"/tmp/.rollbank-cmd-{uuid.uuid4().hex}.sh"
            await self.write_file(script, command.encode(), mode=0o600)
            command = ["/bin/sh", "-c", 'trap \'rm -f "$0"\' EXIT; . "$0"', script]
        oom_before = self.cgroup.oom_kills()
        try:
            res = await self._run(command, cwd=cwd, env=env, stdin=stdin, limit=output_limit,
                                  deadline_s=deadline, pins=pins)
        except OSError as exc:  # e.g. E2BIG for a huge argv list: the command is invalid
            return ExecResult(126, None, "", f"rollbank: cannot run the command: {exc}\n", 0.0)
        stall = min(res.duration_s, res.bill.stall_s) if res.bill else 0.0
        self._charge(res.duration_s - stall, None)
        self._stall_s += stall
        rc = res.returncode
        sig = -rc if rc < 0 else None
        out, out_t = res.stdout.text()
        err, err_t = res.stderr.text()
        if failure_of(res) is HelperFailure.PIDS_LIMIT:  # the model's processes took every pid
            rc, err = 126, NO_PID + err
        return ExecResult(
            exit_code=None if (sig is not None or res.deadline_hit or res.host_stalled) else rc,
            signal=sig,
            stdout=out,
            stderr=err,
            duration_s=res.duration_s,
            timed_out=res.deadline_hit and not budget_bound,
            budget_exhausted=res.deadline_hit and budget_bound,
            stdout_truncated=out_t,
            stderr_truncated=err_t,
            oom_killed=self.cgroup.oom_kills() > oom_before,
            pids_limit_hit=bool(res.bill and res.bill.pids_hits),
            stall_s=stall,
            host_stalled=res.host_stalled,
        )

    # ---------------------------------------------------------------- files
    async def _check(self, argv: Sequence[str], what: str, stdin: bytes | None = None,
                     limit: int = 1 << 20) -> bytes:
        res = await self._run(argv, cwd="/", env=None, stdin=stdin, limit=limit, deadline_s=300)
        if res.returncode != 0:
            msg = res.stderr.raw().decode(errors="replace").strip()
            if "No such file" in msg:
                raise FileNotFoundError(f"{what}: {msg}")
            raise SandboxError(f"{what} failed in sandbox {self._id}: {msg}")
        return res.stdout.raw()

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        script = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1" && chmod "$2" -- "$1"'
        await self._check(["/bin/sh", "-c", script, "sh", path, f"{mode:o}"],
                          f"write {path}", stdin=data)

    async def read_file(self, path: str, *, limit: int | None = None) -> bytes:
        argv = ["/bin/cat", "--", path] if limit is None else ["/usr/bin/head", "-c", str(limit), "--", path]
        return await self._check(argv, f"read {path}", limit=_FILE_LIMIT)

    async def upload(self, local: Path, remote: str) -> None:
        is_dir, payload, mode = await asyncio.to_thread(pack, local)
        if is_dir:
            await self._check(
                ["/bin/sh", "-c", 'mkdir -p -- "$1" && tar -x --no-same-owner -C "$1"', "sh", remote],
                f"upload {local} -> {remote}", stdin=payload,
            )
        else:
            await self.write_file(remote, payload, mode=mode)

    async def download(self, remote: str, local: Path) -> None:
        parent, name = os.path.split(remote.rstrip("/") or "/")
        data = await self._check(["/bin/tar", "-c", "-C", parent or "/", "--", name],
                                 f"download {remote}", limit=_FILE_LIMIT)
        await asyncio.to_thread(unpack, data, name, local)

    # ---------------------------------------------------------------- shell
    async def shell(self) -> ShellSession:
        async def spawn() -> tuple[subprocess.Popen[bytes], Callable[[], Awaitable[None]], Meter]:
            if not self.alive:
                raise SandboxDiedError(f"sandbox {self._id} is not running")
            group, files = self.cgroup.new_exec_group()
            shell = "if [ -x /bin/bash ]; then exec /bin/bash --noprofile --norc; else exec /bin/sh; fi"
            # the agent's session runs as the image's USER (docker exec without -u)
            argv = exec_argv(anchor_pid=self.anchor_pid, procs_files=files, rlimits=self._rlimits,
                             command=as_user(self.spec.user, ["/bin/sh", "-c", shell]),
                             cwd=self.spec.workdir, drop_caps=self._drop_caps,
                             helper=self._helper, rlimit_vals=self._rlimit_vals)
            # Popen (fork+exec, ~1 ms) rather than asyncio subprocesses: no watcher threads.
            proc = subprocess.Popen(  # noqa: ASYNC220
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=self._env(None), close_fds=True, start_new_session=True,
            )

            async def kill() -> None:
                await self.cgroup.akill_exec_group(group)
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)

            return proc, kill, lambda: self.cgroup.reading(group, time.monotonic())

        session = LocalShellSession(spawn, self._billed, max_host_stall_s=self._max_stall)
        self._shells.append(session)
        return session

    # ---------------------------------------------------------------- snapshot / usage / close
    async def snapshot(self) -> LocalSnapshot:
        if not self.alive:
            raise SandboxDiedError(f"sandbox {self._id} is not running")
        sid = "s" + uuid.uuid4().hex[:12]
        dst = self._backend.snapshot_dir / sid
        upper = Path(f"/proc/{self._init.pid}/root{self._mount_dir}/upper")
        await self.cgroup.afreeze(True)
        try:
            await copy_tree(upper, dst)
        finally:
            await self.cgroup.afreeze(False)
        snap = LocalSnapshot(sid, self.spec).child(sid, dst)
        self._backend.register_snapshot(snap)
        return snap

    def _billed(self, used: float, stall: Bill | None, timeout_s: float | None
                ) -> tuple[float | None, bool]:
        """The shell session's charger: record its command's bill, then charge."""
        if stall is not None:
            self._last = stall
            self._stall_s += min(used, stall.stall_s)
            used = max(0.0, used - stall.stall_s)
        return self._charge(used, timeout_s)

    def usage(self) -> SandboxUsage:
        last = self._last
        return SandboxUsage(
            exec_seconds=self._exec_s,
            peak_memory_bytes=self.cgroup.peak_memory(),
            pids_limit_hit=bool(last and last.pids_hits),
            memory_limit_hit=bool(last and last.oom_kills),
            stall_seconds=self._stall_s,
            oom_kills_total=self.cgroup.oom_kills() - self._oom_base,
            pids_limit_hits_total=self.cgroup.pids_limit_hits() - self._pids_base,
        )

    async def close(self) -> None:
        """Idempotent; the teardown finishes even if the caller is cancelled meanwhile (a
        later ``close`` waits for it), so no process or cgroup is left behind."""
        if self._teardown is None:
            self._closed = True
            self._teardown = asyncio.ensure_future(self._close_now())
        await asyncio.shield(self._teardown)

    async def _close_now(self) -> None:
        for s in self._shells:
            with contextlib.suppress(Exception):
                await s.close()
        await self.cgroup.akill()
        with contextlib.suppress(OSError):
            self._init.kill()
        await await_exit(self._init, 5.0)
        await asyncio.to_thread(self.cgroup.remove)  # rmdir of memory cgroups can block
        if self.channel_dir is not None:
            await asyncio.to_thread(shutil.rmtree, self.channel_dir, True)
        self._backend.forget(self)
