"""Cgroups for local sandboxes: limits, accounting, freeze and kill-everything.

Owns the cgroup directories of every sandbox this process starts. Detection: a pure cgroup v2
host (``/sys/fs/cgroup/cgroup.controllers``) uses v2 for everything; a hybrid host (this
machine: memory, cpu, pids as v1 under ``/sys/fs/cgroup/<ctrl>``, an empty v2 hierarchy at
``/sys/fs/cgroup/unified``) puts limits in v1 and uses the v2 hierarchy, which needs no
controller, for ``cgroup.kill`` and ``cgroup.freeze``; without it, the v1 freezer and a kill
loop over ``tasks`` are used.

Layout: ``<hierarchy>/<own cgroup>/rollbank/o<owner pid>-<owner start time>/<sandbox id>``;
the v2 group of a sandbox has one child per command (``x<n>``) so a timed-out command's whole
tree is killed without touching the rest of the sandbox.

Invariants
- A sandbox's processes are placed in its groups by the process itself *before* it execs
  anything (shell ``echo $$ > cgroup.procs``), so no child escapes accounting.
- :meth:`SandboxCgroup.akill` returns only when no process of the sandbox remains.
- No method that waits blocks the event loop: freeze/kill are async (``asyncio.sleep``
  polling of ``cgroup.events``); only ``reaper.reap_dead_owners``, which runs in a worker
  thread at backend start, waits synchronously.
- ``reaper.reap_dead_owners`` removes groups whose owner process no longer exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from rollbank.errors import IsolationUnavailableError
from rollbank.sandbox.billing import StallReading

ROOT = Path("/sys/fs/cgroup")
KILL_WAIT_S = 10.0  # how long kill() keeps signalling until the sandbox's processes are gone
V1_CONTROLLERS = ("memory", "pids", "cpu")


def _own_path(controller: str | None) -> str:
    """This process's cgroup path in a v1 controller hierarchy, or in v2 when None."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hid, ctrls, path = line.split(":", 2)
        if controller is None and hid == "0":
            return path
        if controller is not None and controller in ctrls.split(","):
            return path
    return "/"


def _starttime(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _pidns() -> str:
    try:
        return str(Path("/proc/self/ns/pid").stat().st_ino)
    except OSError:
        return "0"


def owner_tag(pid: int | None = None) -> str:
    """``o<pid>-<start time>-<pid namespace>``: names an orchestrator process uniquely."""
    pid = os.getpid() if pid is None else pid
    return f"o{pid}-{_starttime(pid)}-{_pidns()}"


def owner_alive(tag: str) -> bool:
    """False only for an owner of *our* pid namespace that no longer exists (safe to reap);
    owners from other pid namespaces cannot be checked and are never reaped."""
    parts = tag[1:].split("-")
    if len(parts) == 2:
        parts.append(_pidns())  # tags written before the namespace was recorded
    if len(parts) != 3 or not parts[0].isdigit():
        return True
    pid_s, start, ns = parts
    return ns != _pidns() or _starttime(int(pid_s)) == start


@dataclass(frozen=True)
class CgroupLayout:
    """Where this process's sandbox groups live (detected once per backend)."""

    v1: dict[str, Path]  # controller -> owner dir (empty on pure v2)
    v2: Path | None  # owner dir in the v2 hierarchy (kill/freeze; limits too on pure v2)
    pure_v2: bool

    @classmethod
    def detect(cls) -> CgroupLayout:
        tag = owner_tag()
        if (ROOT / "cgroup.controllers").exists():
            # Under the root cgroup (exempt from "no internal processes"): our own cgroup holds
            # our process, so controllers could not be enabled below it. Untested here (this
            # machine is a hybrid): fails with IsolationUnavailableError rather than run unlimited.
            base = ROOT / "rollbank"
            _mkdir(base)
            try:
                for ctrl in ("memory", "pids", "cpu"):
                    if ctrl not in (ROOT / "cgroup.subtree_control").read_text().split():
                        (ROOT / "cgroup.subtree_control").write_text(f"+{ctrl}")
                    (base / "cgroup.subtree_control").write_text(f"+{ctrl}")
            except OSError as exc:
                raise IsolationUnavailableError(
                    f"cgroup v2 controllers memory/pids/cpu cannot be delegated at {base}: {exc}"
                ) from exc
            own = base / tag
            _mkdir(own)
            for ctrl in ("memory", "pids", "cpu"):
                (own / "cgroup.subtree_control").write_text(f"+{ctrl}")
            return cls(v1={}, v2=own, pure_v2=True)
        v1: dict[str, Path] = {}
        has_v2 = (ROOT / "unified" / "cgroup.procs").exists()
        # The v1 freezer is only needed when there is no v2 hierarchy for cgroup.freeze/kill.
        for ctrl in (*V1_CONTROLLERS, *(() if has_v2 else ("freezer",))):
            mount = ROOT / ctrl
            if not (mount / "cgroup.procs").exists():
                if ctrl == "freezer":
                    continue
                raise IsolationUnavailableError(
                    f"cgroup v1 controller {ctrl!r} is not mounted at {mount} and this host "
                    "has no cgroup v2 hierarchy: limits cannot be enforced"
                )
            own = mount / _own_path(ctrl).lstrip("/") / "rollbank" / tag
            _mkdir(own)
            v1[ctrl] = own
        v2: Path | None = None
        unified = ROOT / "unified"
        if has_v2:
            v2 = unified / _own_path(None).lstrip("/") / "rollbank" / tag
            _mkdir(v2)
        return cls(v1=v1, v2=v2, pure_v2=False)

    def create(self, sandbox_id: str) -> SandboxCgroup:
        v1 = {c: p / sandbox_id for c, p in self.v1.items()}
        for p in v1.values():
            _mkdir(p)
        v2 = self.v2 / sandbox_id if self.v2 is not None else None
        if v2 is not None:
            _mkdir(v2)
            if self.pure_v2:
                for ctrl in ("memory", "pids", "cpu"):
                    with contextlib.suppress(OSError):
                        (v2 / "cgroup.subtree_control").write_text(f"+{ctrl}")
        return SandboxCgroup(v1=v1, v2=v2, pure_v2=self.pure_v2)

    def remove_owner_dirs(self) -> None:
        for p in [*self.v1.values(), *([self.v2] if self.v2 else [])]:
            _rmtree_cgroup(p)


@dataclass
class SandboxCgroup:
    """The groups of one sandbox."""

    v1: dict[str, Path]
    v2: Path | None
    pure_v2: bool
    _n: int = field(default=0)

    # ---------------------------------------------------------------- placement
    def init_procs_files(self) -> list[Path]:
        """Files the sandbox's init writes its own pid to before exec'ing bubblewrap."""
        files = [p / "cgroup.procs" for p in self.v1.values()]
        if self.v2 is not None:
            if self.pure_v2:
                _mkdir(self.v2 / "init")
                files.append(self.v2 / "init" / "cgroup.procs")
            else:
                files.append(self.v2 / "cgroup.procs")
        return files

    def new_exec_group(self) -> tuple[str, list[Path]]:
        """A fresh per-command group: (name, procs files the command's wrapper joins)."""
        self._n += 1
        name = f"x{self._n}"
        files = [p / "cgroup.procs" for p in self.v1.values()]
        if self.v2 is not None:
            _mkdir(self.v2 / name)
            files.append(self.v2 / name / "cgroup.procs")
        return name, files

    def drop_exec_group(self, name: str) -> None:
        if self.v2 is not None:
            with contextlib.suppress(OSError):
                (self.v2 / name).rmdir()  # fails (EBUSY) while background processes live on

    # ---------------------------------------------------------------- limits and accounting
    def set_limits(self, *, memory_bytes: int, pids: int, cpus: float) -> None:
        period = 100_000
        quota = max(1000, int(cpus * period))
        if self.pure_v2:
            assert self.v2 is not None
            (self.v2 / "memory.max").write_text(str(memory_bytes))
            with contextlib.suppress(OSError):
                (self.v2 / "memory.swap.max").write_text("0")
            (self.v2 / "pids.max").write_text(str(pids))
            (self.v2 / "cpu.max").write_text(f"{quota} {period}")
            return
        mem = self.v1["memory"]
        (mem / "memory.limit_in_bytes").write_text(str(memory_bytes))
        with contextlib.suppress(OSError):
            (mem / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
        (self.v1["pids"] / "pids.max").write_text(str(pids))
        cpu = self.v1["cpu"]
        # Writing cpu.cfs_period_us costs ~3 ms here (measured); it is inherited, so only
        # write it when it differs.
        if _read_int(cpu / "cpu.cfs_period_us") != period:
            (cpu / "cpu.cfs_period_us").write_text(str(period))
        (cpu / "cpu.cfs_quota_us").write_text(str(quota))

    def oom_kills(self) -> int:
        if self.pure_v2:
            return _kv(self.v2 / "memory.events" if self.v2 else None).get("oom_kill", 0)
        return _kv(self.v1["memory"] / "memory.oom_control").get("oom_kill", 0)

    def pids_limit_hits(self) -> int:
        d = self.v2 if self.pure_v2 else self.v1.get("pids")
        return _kv(d / "pids.events" if d else None).get("max", 0)

    def peak_memory(self) -> int | None:
        if self.pure_v2:
            return _read_int(self.v2 / "memory.peak") if self.v2 else None
        return _read_int(self.v1["memory"] / "memory.max_usage_in_bytes")

    def memory_current(self) -> int:
        if self.pure_v2:
            return _read_int(self.v2 / "memory.current") if self.v2 else 0
        return _read_int(self.v1["memory"] / "memory.usage_in_bytes")

    def pids(self) -> list[int]:
        d = self.v2 if self.pure_v2 or "pids" not in self.v1 else self.v1["pids"]
        if d is None:
            return []
        out: list[int] = []
        for f in d.rglob("cgroup.procs"):
            with contextlib.suppress(OSError):
                out += [int(x) for x in f.read_text().split()]
        return out

    def reading(self, group: str | None, now: float) -> StallReading:
        """Cumulative stall/event counters for billing (``group``: a per-command group name,
        None for the whole sandbox); counters this kernel lacks read as 0."""
        g = (self.v2 / group if group else self.v2) if self.v2 is not None else None
        frozen = _kv(g / "cgroup.stat.local" if g else None).get("frozen_usec", 0) / 1e6
        full = 0.0
        if g is not None:
            with contextlib.suppress(OSError, ValueError, IndexError):
                line = _read(g / "cpu.pressure").splitlines()[1]  # "full ... total=N"
                full = int(line.rsplit("total=", 1)[1]) / 1e6
        if self.pure_v2:
            throttled = _kv(self.v2 / "cpu.stat" if self.v2 else None).get("throttled_usec", 0) / 1e6
        else:
            throttled = _kv(self.v1["cpu"] / "cpu.stat").get("throttled_time", 0) / 1e9
        # CPU the command's group got (progress beyond the stall cap; v2 always has it)
        used = _kv(g / "cpu.stat" if g else None).get("usage_usec")
        return StallReading(t=now, frozen_s=frozen, cpu_full_s=full, throttled_s=throttled,
                            oom_kills=self.oom_kills(), pids_hits=self.pids_limit_hits(),
                            cpu_used_s=None if used is None else used / 1e6)

    # ---------------------------------------------------------------- freeze / kill / remove
    # Only async versions for the sandbox's own groups: every caller is on the event loop.
    async def afreeze(self, frozen: bool) -> None:
        """Freeze (or thaw) every process of the sandbox; return once the kernel says so."""
        if self.v2 is not None:
            (self.v2 / "cgroup.freeze").write_text("1" if frozen else "0")
            await _await_events(self.v2, "frozen 1" if frozen else "frozen 0", limit_s=1.0)
            return
        if "freezer" in self.v1:
            (self.v1["freezer"] / "freezer.state").write_text("FROZEN" if frozen else "THAWED")

    async def akill(self) -> None:
        """SIGKILL every process of the sandbox; return when none is left (or after
        ``KILL_WAIT_S`` on a host too loaded to reap them), never blocking the event loop."""
        seen = set(self.pids())
        if self.v2 is not None:
            with contextlib.suppress(OSError):
                (self.v2 / "cgroup.kill").write_text("1")
            await _await_events(self.v2, "populated 0", limit_s=2.0)
        deadline = time.monotonic() + KILL_WAIT_S  # the v1 fallback (and stragglers)
        delay = 0.0005
        while (pids := self.pids()) and time.monotonic() < deadline:
            seen.update(pids)
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, 9)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)
        # a process leaves its cgroup a moment before it has finished exiting
        while (seen := {p for p in seen if _running(p)}) and time.monotonic() < deadline:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.02)

    async def akill_exec_group(self, name: str) -> None:
        """Kill one command's group (everything it spawned) and remove it."""
        if self.v2 is None:
            return  # caller falls back to killing the process group
        g = self.v2 / name
        with contextlib.suppress(OSError):
            (g / "cgroup.kill").write_text("1")
        await _await_events(g, "populated 0", limit_s=1.0)
        with contextlib.suppress(OSError):
            g.rmdir()

    async def akill_exec_groups(self) -> None:
        """Kill every per-command group (what commands left running), one ``cgroup.kill``
        each: a process that keeps forking new copies cannot slip out. The init stays."""
        groups = [] if self.v2 is None else [p.name for p in self.v2.glob("x*") if p.is_dir()]
        for name in groups:
            await self.akill_exec_group(name)

    def remove(self) -> None:
        for p in [*self.v1.values(), *([self.v2] if self.v2 else [])]:
            _rmtree_cgroup(p)


async def _await_events(group: Path, want: str, *, limit_s: float) -> None:
    """Poll ``cgroup.events`` with asyncio sleeps until it shows ``want`` (or ``limit_s``)."""
    deadline = time.monotonic() + limit_s
    delay = 0.0002
    while time.monotonic() < deadline:
        try:
            if want in (group / "cgroup.events").read_text():
                return
        except OSError:
            return
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.01)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (it has not finished exiting)."""
    try:
        stat = _read(Path(f"/proc/{pid}/stat"))
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] not in (["Z"], ["X"])


def _read(path: Path) -> str:
    """A small kernel file in one read (cheaper than ``Path.read_text``: read per command)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096).decode()
    finally:
        os.close(fd)


def _kv(path: Path | None) -> dict[str, int]:
    if path is None:
        return {}
    try:
        text = _read(path)
    except OSError:
        return {}
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _read_int(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _mkdir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise IsolationUnavailableError(f"cannot create cgroup {path}: {exc}") from exc


def _rmtree_cgroup(path: Path) -> None:
    """Remove a cgroup directory tree bottom-up (cgroup dirs are removed with rmdir)."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            _rmtree_cgroup(Path(entry.path))
    with contextlib.suppress(OSError):
        path.rmdir()
