"""The local sandbox backend: bubblewrap + overlayfs + cgroups + rlimits on this host.

Owns :class:`LocalBackend` (start, fork, snapshot_spec, aclose) and the lifetime of every
sandbox, cgroup and snapshot directory it creates. How a sandbox is assembled is in
:mod:`rollbank.sandbox.local.runtime`; cgroups in :mod:`rollbank.sandbox.local.cgroups`.

Invariants
- Isolation or nothing: if this host cannot isolate (not root, no bubblewrap, no overlayfs,
  no cgroups), :class:`~rollbank.errors.IsolationUnavailableError` is raised; there is no
  unsandboxed fallback.
- A task asks for the network (``spec.network``); it gets it only if the operator set
  ``allow_network``. Limits are the spec's, capped by the operator's config.
- Nothing outlives the orchestrator: sandboxes die with the spawning thread
  (``--die-with-parent``), mounts exist only in each sandbox's mount namespace, and what a
  SIGKILLed orchestrator left behind (cgroups, snapshot dirs) is reaped by the next backend.
- Sandboxes must be started from the thread running the event loop, which must outlive them
  (``--die-with-parent`` is tied to the spawning *thread*, not the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import struct
import subprocess
import uuid
from dataclasses import replace
from pathlib import Path
from types import TracebackType

from rollbank.errors import IsolationUnavailableError, SandboxError, SandboxStartError
from rollbank.sandbox.local.cgroups import CgroupLayout, owner_alive, owner_tag
from rollbank.sandbox.local.config import LocalSandboxConfig
from rollbank.sandbox.local.etc_files import etc_files, host_resolv, memfds, wants_etc
from rollbank.sandbox.local.helper import helper_path
from rollbank.sandbox.local.proc import await_exit
from rollbank.sandbox.local.reaper import reap_dead_owners
from rollbank.sandbox.local.runtime import (
    NSENTER,
    SETPRIV_IN_SANDBOX,
    UNSHARE,
    IdMapping,
    init_argv,
    rlimit_shell,
    rlimit_values,
)
from rollbank.sandbox.local.sandbox import LocalSandbox
from rollbank.sandbox.local.snapshot import LocalSnapshot
from rollbank.sandbox.local.userns import USERNS_COUNT, mapping_userns, probe_userns
from rollbank.sandbox.protocol import Limits, Sandbox, SandboxBackend, SandboxSpec, Snapshot

_START_TIMEOUT_S = 30.0


def check_isolation(config: LocalSandboxConfig) -> None:
    """Raise :class:`IsolationUnavailableError` naming what this host lacks."""
    problems = []
    if os.geteuid() != 0:
        problems.append("the local backend must run as root (mounts, cgroups)")
    for tool in (config.bwrap, UNSHARE, NSENTER, "/bin/sh", "/bin/cp"):
        if not os.access(tool, os.X_OK):
            problems.append(f"{tool} is missing (apt-get install bubblewrap util-linux)")
    try:
        fs = Path("/proc/filesystems").read_text()
    except OSError:
        fs = ""
    for name in ("overlay", "tmpfs"):
        if name not in fs:
            problems.append(f"the kernel has no {name} filesystem")
    if problems:
        raise IsolationUnavailableError("cannot isolate sandboxes here: " + "; ".join(problems))


class LocalBackend:
    """Starts isolated sandboxes on this host. One per process; ``aclose`` cleans up all."""

    def __init__(self, config: LocalSandboxConfig | None = None) -> None:
        self.config = config or LocalSandboxConfig()
        self._layout: CgroupLayout | None = None
        self._helper: Path | None = None
        #: the sandboxes' id mapping (None: their root is host uid 0) and why it is what it is
        self.userns: IdMapping | None = None
        self.userns_reason = "not decided yet (the backend has not started a sandbox)"
        self._sandboxes: dict[str, LocalSandbox] = {}
        self._snapshots: dict[str, LocalSnapshot] = {}
        self._sem = asyncio.Semaphore(self.config.max_concurrent_starts)
        self._setup_lock = asyncio.Lock()
        self._owner = owner_tag()
        self._owner_dir = self.config.run_dir / self._owner
        self.mount_dir = self.config.run_dir / "mnt"
        self.snapshot_dir = self._owner_dir / "snapshots"
        self._closed = False
        self._resolv = host_resolv()  # what /etc/resolv.conf of every sandbox is made from

    # ---------------------------------------------------------------- setup
    async def _ready(self) -> CgroupLayout:
        """First use: checks, reaping, cgroup detection, helper build (off the event loop)."""
        if self._closed:
            raise SandboxError("backend is closed")
        if self._layout is None:
            async with self._setup_lock:
                if self._layout is None:
                    await asyncio.to_thread(self._ensure_ready)
        return self._ensure_ready()

    def _ensure_ready(self) -> CgroupLayout:
        if self._closed:
            raise SandboxError("backend is closed")
        if self._layout is None:
            check_isolation(self.config)
            if self.config.reap_on_start:
                self.reap()
            self.mount_dir.mkdir(parents=True, exist_ok=True)
            # root only: snapshots are faithful copies (a setuid-root file an agent made stays
            # setuid) and must not be reachable by the host's other users
            self._owner_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._owner_dir.chmod(0o700)
            self.snapshot_dir.mkdir(parents=True, exist_ok=True)
            (self._owner_dir / "err").mkdir(parents=True, exist_ok=True)
            self._layout = CgroupLayout.detect()
            self._helper = helper_path() if self.config.use_helper else None
            self._decide_userns()
        return self._layout

    def _decide_userns(self) -> None:
        mode, host_id = self.config.userns, self.config.userns_host_id
        if mode == "off":
            self.userns, self.userns_reason = None, "off by configuration (userns = 'off')"
            return
        why = probe_userns(self._helper, self.mount_dir, host_id, self.config.bwrap)
        if why is None:
            try:
                fd = mapping_userns(host_id, USERNS_COUNT)
            except OSError as exc:
                why = f"cannot make the mapping's user namespace: {exc}"
        if why is None:
            self.userns = IdMapping(host_id, USERNS_COUNT, userns_fd=fd,
                                    full=self.config.userns_full_range)
            self.userns_reason = f"mapped: sandbox root is host uid {host_id} ({mode})"
        elif mode == "mapped":
            self._layout = None
            raise IsolationUnavailableError(f"userns = 'mapped' is not possible here: {why}")
        else:
            self.userns, self.userns_reason = None, f"off (auto): {why}"

    def reap(self) -> int:
        """Remove what dead orchestrators left: cgroups (killing their processes), dirs."""
        n = reap_dead_owners()
        if self.config.run_dir.is_dir():
            for d in self.config.run_dir.iterdir():
                if d.name.startswith("o") and d.is_dir() and not owner_alive(d.name):
                    shutil.rmtree(d, ignore_errors=True)
                    n += 1
        return n

    def _limits(self, limits: Limits) -> Limits:
        c = self.config
        return replace(
            limits,
            cpus=min(limits.cpus, c.max_cpus),
            memory_mb=min(limits.memory_mb, c.max_memory_mb),
            storage_mb=min(limits.storage_mb, c.max_storage_mb),
            max_processes=min(limits.max_processes, c.max_processes),
        )

    # ---------------------------------------------------------------- protocol
    async def start(self, spec: SandboxSpec, *, budget_s: float | None = None) -> LocalSandbox:
        layout = await self._ready()
        async with self._sem:
            return await self._start(layout, spec, budget_s)

    async def _start(
        self, layout: CgroupLayout, spec: SandboxSpec, budget_s: float | None
    ) -> LocalSandbox:
        lim = self._limits(spec.limits)
        sbid = "b" + uuid.uuid4().hex[:12]
        cg = layout.create(sbid)
        init: subprocess.Popen[bytes] | None = None
        errfile = self._owner_dir / "err" / sbid
        chan = self._channel(sbid)
        etc = memfds(etc_files(spec.hostname, self._resolv)) if wants_etc(spec.layers) else []
        ready: socket.socket | None = None
        ready_w = -1
        try:
            if self._helper is not None:  # the anchor says when it runs (rb-helper anchor FD)
                ready, ready_w = _ready_channel()
            cg.set_limits(
                memory_bytes=lim.memory_mb << 20, pids=lim.max_processes, cpus=lim.cpus
            )
            rl = rlimit_shell(open_files=lim.max_open_files, file_size_mb=lim.max_file_size_mb)
            rv = rlimit_values(open_files=lim.max_open_files, file_size_mb=lim.max_file_size_mb)
            argv = init_argv(
                procs_files=cg.init_procs_files(), mount_dir=self.mount_dir, layers=spec.layers,
                storage_mb=lim.storage_mb, rlimits=rl, bwrap=self.config.bwrap,
                hostname=spec.hostname, network=spec.network and self.config.allow_network,
                helper=self._helper, rlimit_vals=rv, mapping=self._mapping(spec),
                channel=chan, files=etc, ready_fd=ready_w if ready_w >= 0 else None,
            )
            fds = tuple(fd for fd, _ in etc) + ((ready_w,) if ready_w >= 0 else ())
            init = _popen_init(argv, errfile, fds if self.userns is None
                               else (self.userns.userns_fd, *fds))
            for fd in fds:  # the init has its own copies
                os.close(fd)
            etc, ready_w = [], -1
            try:
                anchor = await (_wait_anchor(init, errfile) if ready is None
                                else _wait_ready(init, ready, errfile))
            finally:
                _unlink(errfile)
            drop = self.config.drop_capabilities and (self._helper is not None or any(
                (layer / SETPRIV_IN_SANDBOX.lstrip("/")).exists() for layer in spec.layers
            ))
            sb = LocalSandbox(
                sandbox_id=sbid, spec=replace(spec, limits=lim), backend=self, init=init,
                anchor_pid=anchor, cgroup=cg, mount_dir=self.mount_dir, rlimits=rl,
                drop_caps=drop, budget_s=budget_s, helper=self._helper, rlimit_vals=rv,
                max_host_stall_s=self.config.max_host_stall_s,
            )
            sb.channel_dir = chan
        except BaseException:
            for fd, _ in etc:
                os.close(fd)
            if ready_w >= 0:
                os.close(ready_w)
            if chan is not None:
                await asyncio.to_thread(shutil.rmtree, chan, True)
            await cg.akill()
            if init is not None:
                with contextlib.suppress(OSError):
                    init.kill()
                await await_exit(init, 5.0)
            await asyncio.to_thread(cg.remove)
            raise
        finally:
            if ready is not None:
                ready.close()
        self._sandboxes[sbid] = sb
        return sb

    def _channel(self, sbid: str) -> Path | None:
        """The sandbox's agent channel directory (root-owned, 0755: the sandbox reads, never
        writes), or None when channels are off."""
        if not self.config.agent_channels:
            return None
        root = self.config.agent_channel_dir / self._owner
        root.mkdir(mode=0o711, parents=True, exist_ok=True)
        chan = root / sbid
        chan.mkdir(mode=0o755)
        return chan

    def _mapping(self, spec: SandboxSpec) -> IdMapping | None:
        """The id mapping for ``spec``: this backend's snapshot layers are already shifted."""
        if self.userns is None:
            return None
        shifted = frozenset(p for p in spec.layers if p.is_relative_to(self.snapshot_dir))
        return replace(self.userns, shifted=shifted)

    async def fork(
        self, snapshot: Snapshot, n: int, *, budget_s: float | None = None
    ) -> list[Sandbox]:
        if not isinstance(snapshot, LocalSnapshot):
            raise SandboxError(f"not a local snapshot: {snapshot!r}")
        layout = await self._ready()
        started: list[Sandbox] = []

        async def one() -> None:
            async with self._sem:
                started.append(await self._start(layout, snapshot.spec, budget_s))

        try:
            async with asyncio.TaskGroup() as tg:
                for _ in range(n):
                    tg.create_task(one())
        except BaseException:
            for sb in started:
                await sb.close()
            raise
        return started

    async def snapshot_spec(self, spec: SandboxSpec) -> LocalSnapshot:
        """The initial state of ``spec`` is its layers: validate them; no copy is needed."""
        await self._ready()
        for layer in spec.layers:
            if not layer.is_dir():
                raise SandboxStartError(f"layer is not a directory: {layer}")
        snap = LocalSnapshot("s" + uuid.uuid4().hex[:12], spec)
        self._snapshots[snap.snapshot_id] = snap
        return snap

    def register_snapshot(self, snap: LocalSnapshot) -> None:
        self._snapshots[snap.snapshot_id] = snap

    def release_snapshot(self, snap: LocalSnapshot) -> None:
        """Delete a snapshot's frozen layer (only when no sandbox or snapshot uses it)."""
        self._snapshots.pop(snap.snapshot_id, None)
        if snap.owned_dir is not None:
            shutil.rmtree(snap.owned_dir, ignore_errors=True)

    def forget(self, sb: LocalSandbox) -> None:
        self._sandboxes.pop(sb.sandbox_id, None)

    @property
    def sandboxes(self) -> list[LocalSandbox]:
        return list(self._sandboxes.values())

    async def aclose(self) -> None:
        for sb in list(self._sandboxes.values()):
            await sb.close()
        self._snapshots.clear()
        if self.userns is not None and not self._closed:
            os.close(self.userns.userns_fd)
        # file-tree and cgroup removal block (memory cgroups offline slowly): off the loop
        await asyncio.to_thread(shutil.rmtree, self._owner_dir, True)
        if self.config.agent_channels:
            await asyncio.to_thread(shutil.rmtree, self.config.agent_channel_dir / self._owner, True)
        if self._layout is not None:
            await asyncio.to_thread(self._layout.remove_owner_dirs)
        self._closed = True

    async def __aenter__(self) -> LocalBackend:
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def _ready_channel() -> tuple[socket.socket, int]:
    """(the backend's end, the descriptor the anchor inherits) of a stream socket pair whose
    backend end has ``SO_PASSCRED``: the kernel attaches the anchor's pid, as seen from this
    pid namespace, to the byte it writes (no ``/proc`` lookup)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        mine.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        mine.setblocking(False)
        return mine, theirs.detach()
    except BaseException:
        mine.close()
        theirs.close()
        raise


def _sender_pid(ancdata: list[tuple[int, int, bytes]]) -> int | None:
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(data) >= 12:
            pid = int(struct.unpack("3i", data[:12])[0])
            return pid if pid > 0 else None
    return None


async def _wait_ready(init: subprocess.Popen[bytes], ready: socket.socket, errfile: Path) -> int:
    """Wait for the anchor's byte on ``ready`` (``rb-helper anchor READY_FD``); return its
    host pid (the byte's credentials). An event, not a poll: a poll's back-off rounds every
    start up to its next probe (up to ~2.5 ms at a 5 ms start). End of file (every writer
    gone: the init or bubblewrap died before the anchor ran) falls back to
    :func:`_wait_anchor`, which reports the init's exit and its stderr."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(ready.fileno(), on_readable)
    try:
        async with asyncio.timeout(_START_TIMEOUT_S):
            await readable
    except TimeoutError:
        raise SandboxStartError(f"sandbox not ready after {_START_TIMEOUT_S:.0f} s") from None
    finally:
        loop.remove_reader(ready.fileno())
    try:
        data, ancdata, _, _ = ready.recvmsg(1, socket.CMSG_SPACE(struct.calcsize("3i")))
    except OSError:
        data, ancdata = b"", []
    if data:
        pid = _sender_pid(ancdata) or _anchor_of(init.pid)
        if pid is not None:
            return pid
    return await _wait_anchor(init, errfile)


async def _wait_anchor(init: subprocess.Popen[bytes], errfile: Path) -> int:
    """Wait until bwrap has exec'd the anchor in the sandbox; return its host pid (polled:
    the shell path's anchor, ``sleep``, cannot say when it runs)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _START_TIMEOUT_S
    delay = 0.0005
    while True:
        if init.poll() is not None:
            err = _read_text(errfile)
            raise SandboxStartError(f"sandbox init exited: {err[-2000:]}")
        pid = _anchor_of(init.pid)
        if pid is not None:
            return pid
        if loop.time() > deadline:
            raise SandboxStartError(f"sandbox not ready after {_START_TIMEOUT_S:.0f} s")
        await asyncio.sleep(delay)
        delay = min(delay * 1.5, 0.01)


def _popen_init(argv: list[str], errfile: Path, fds: tuple[int, ...] = ()
                ) -> subprocess.Popen[bytes]:
    # Forked by the loop thread: bwrap's --die-with-parent follows this thread. (Forking from
    # a spawner thread pool or a zygote process was measured here: no faster, more parts.)
    with errfile.open("wb") as errlog:
        return subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errlog,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, close_fds=True, pass_fds=fds,
        )


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


def _anchor_of(outer: int) -> int | None:
    """The sandbox's pid 1 once bwrap has exec'd it (its command name is no longer bwrap)."""
    try:
        if Path(f"/proc/{outer}/comm").read_text().strip() != "bwrap":
            return None  # the init has not exec'd bubblewrap yet (its children are mounts)
    except OSError:
        return None
    for cand in _children(outer):
        try:
            # not bubblewrap's pid 1 before its exec, nor the full id range's mapper
            if Path(f"/proc/{cand}/comm").read_text().strip() not in ("bwrap", "rb-mapper"):
                return cand
        except OSError:
            continue
    return None


def _conforms(b: LocalBackend) -> SandboxBackend:
    return b  # mypy checks LocalBackend against the protocol here
